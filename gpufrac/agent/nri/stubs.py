"""The generated protobuf modules of NRI's api.proto and ttrpc's request envelope (hack/grpc-stubs.sh writes them
from proto/ at build and test time; they are not committed)."""

from __future__ import annotations

from gpufrac.agent.decide.errors import ConfigError

try:
    from gpufrac.agent.nri.generated import api_pb2, request_pb2
except ImportError as err:  # a source checkout where the stubs were never generated
    raise ConfigError(
        f"the NRI protobuf modules are missing ({err}): run `make stubs` (hack/grpc-stubs.sh generate) to generate "
        "them from the vendored proto/"
    ) from err

__all__ = ["api_pb2", "request_pb2"]
