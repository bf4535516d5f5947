"""The kubelet's plugin registration API, generated (hack/grpc-stubs.sh writes it at build and test time; never
committed): the one compiled copy the CSI and the DRA plugins share."""

from __future__ import annotations

from gpufrac.agent.decide.errors import ConfigError

try:
    from gpufrac.agent.kubelet_plugin.generated import pluginregistration_pb2, pluginregistration_pb2_grpc
except ImportError as err:  # a source checkout where the stubs were never generated
    raise ConfigError(
        f"the kubelet plugin registration stubs are missing ({err}): run `make stubs` (hack/grpc-stubs.sh) to "
        "generate them from the kubelet's pluginregistration api.proto"
    ) from err

__all__ = ["pluginregistration_pb2", "pluginregistration_pb2_grpc"]
