"""The generated CSI gRPC modules (hack/grpc-stubs.sh writes them at build and test time; they are not committed).
The kubelet's registration API is the kubelet plugin's own (kubelet_plugin.stubs)."""

from __future__ import annotations

from gpufrac.agent.decide.errors import ConfigError

try:
    from gpufrac.agent.csi.generated import csi_pb2, csi_pb2_grpc
except ImportError as err:  # a source checkout where the stubs were never generated
    raise ConfigError(
        f"the CSI gRPC stubs are missing ({err}): run `make stubs` (hack/grpc-stubs.sh) to generate them from the "
        "upstream csi.proto"
    ) from err

__all__ = ["csi_pb2", "csi_pb2_grpc"]
