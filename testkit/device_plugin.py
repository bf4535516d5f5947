"""A device plugin for the real node's kubelet, for tests: it advertises one device of an extended resource and
answers Allocate with CDI device names (ContainerAllocateResponse.cdi_devices), the way NVIDIA's device plugin
does with its CDI strategy. The kubelet passes them to containerd in the CRI request, and containerd resolves
them against the node's CDI specs: a path to a container's devices that involves no gpufrac code.

Its gRPC stubs are generated into a temporary directory from the kubelet's deviceplugin/v1beta1 api.proto
vendored under proto/ (hack/grpc-stubs.sh vendor); nothing generated is committed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from testkit import REPO_ROOT
from testkit.grpc_stubs import stubs_from

PROTO = REPO_ROOT / "proto" / "k8s.io" / "kubelet" / "pkg" / "apis" / "deviceplugin" / "v1beta1" / "api.proto"
# Hard-coded in the kubelet (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.DevicePluginPath), whatever its root dir.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
STUB = "deviceplugin_v1beta1"


def generate_stubs(out: Path) -> tuple[ModuleType, ModuleType]:
    """(messages, services) generated with grpcio-tools from the vendored api.proto into `out`."""
    return stubs_from(PROTO, out, STUB)


class CdiDevicePlugin:
    """Serves `resource` (one device, `device_id`) on the kubelet's device plugin socket directory; every
    allocation gets `cdi_devices`. A context manager: registered on entry, gone (socket removed) on exit."""

    def __init__(self, stubs: tuple[ModuleType, ModuleType], resource: str, device_id: str,
                 cdi_devices: list[str]) -> None:
        self.pb, self.rpc = stubs
        self.resource, self.device_id, self.cdi_devices = resource, device_id, cdi_devices
        self.socket = DEVICE_PLUGIN_DIR / f"gpufrac-e2e-{resource.replace('/', '-')}.sock"
        self.allocations: list[list[str]] = []
        self._stopped = threading.Event()
        self._server: grpc.Server | None = None

    # -- the DevicePlugin service ----------------------------------------------------------------------------

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.pb.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        yield self.pb.ListAndWatchResponse(devices=[self.pb.Device(ID=self.device_id, health="Healthy")])
        self._stopped.wait()

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.pb.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        responses = []
        for req in request.container_requests:
            self.allocations.append(list(req.devices_ids))
            responses.append(self.pb.ContainerAllocateResponse(
                cdi_devices=[self.pb.CDIDevice(name=name) for name in self.cdi_devices]))
        return self.pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.pb.PreStartContainerResponse()

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> CdiDevicePlugin:
        self.socket.unlink(missing_ok=True)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.rpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()
        with grpc.insecure_channel(f"unix://{DEVICE_PLUGIN_DIR / 'kubelet.sock'}") as channel:
            self.rpc.RegistrationStub(channel).Register(self.pb.RegisterRequest(
                version="v1beta1", endpoint=self.socket.name, resource_name=self.resource), timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=1).wait()
        self.socket.unlink(missing_ok=True)
