"""The fake libnvidia-ml.so.1's calls that NVIDIA's own components make (k8s-device-plugin and `nvidia-ctk cdi
generate`, through go-nvml), exercised with NVIDIA's own Python binding (nvidia-ml-py): each answer comes from the
GPU's entry in the state file, a field the file lacks is NOT_SUPPORTED (as NVML answers for what a board lacks), and
critical XID errors written to the file reach registered event sets."""

from __future__ import annotations

import subprocess
import sys
import time

import pynvml
import pytest

from testkit.fakes.build import fake_nvml_library
from testkit.fakes.state import FakeGpuState

UUIDS = ("GPU-aaaa0000-0000-0000-0000-000000000000", "GPU-bbbb1111-1111-1111-1111-111111111111")


@pytest.fixture
def gpus(fake_gpus: FakeGpuState) -> FakeGpuState:
    for uuid in UUIDS:
        fake_gpus.gpu(uuid)
    pynvml.nvmlInit()
    yield fake_gpus
    pynvml.nvmlShutdown()


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def test_a_gpu_is_found_by_uuid_and_an_unknown_one_is_not_found(gpus: FakeGpuState) -> None:
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(UUIDS[1])) == 1
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-dead-0000-0000-000000000000")


def test_what_nvidias_components_ask_about_a_gpu_comes_from_its_entry(gpus: FakeGpuState) -> None:
    first, second = (pynvml.nvmlDeviceGetHandleByUUID(u) for u in UUIDS)
    assert [pynvml.nvmlDeviceGetMinorNumber(h) for h in (first, second)] == [0, 1]
    pci = pynvml.nvmlDeviceGetPciInfo(second)
    assert (text(pci.busId), text(pci.busIdLegacy)) == ("00000000:2A:00.0", "0000:2A:00.0")
    assert (pci.domain, pci.bus, pci.device, pci.pciDeviceId) == (0, 0x2A, 0, 0x233510DE)
    assert pynvml.nvmlDeviceGetArchitecture(first) == pynvml.NVML_DEVICE_ARCH_HOPPER
    assert pynvml.nvmlDeviceGetCudaComputeCapability(first) == (9, 0)
    assert pynvml.nvmlDeviceGetBrand(first) == pynvml.NVML_BRAND_NVIDIA
    assert pynvml.nvmlDeviceGetMigMode(first) == [0, 0]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(first) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):  # MIG off: no MIG device at any index
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(first, 0)
    gpu = gpus.state["gpus"][1]
    gpu.update(minor_number=5, pci_bus_id="00000001:DB:00.0", pci_device_id="0x233010de", architecture="blackwell",
               cuda_compute_capability="10.0", brand="tesla")
    gpus.write()
    assert pynvml.nvmlDeviceGetMinorNumber(second) == 5
    pci = pynvml.nvmlDeviceGetPciInfo(second)
    assert (text(pci.busId), pci.domain, pci.bus, pci.pciDeviceId) == ("00000001:DB:00.0", 1, 0xDB, 0x233010DE)
    assert pynvml.nvmlDeviceGetArchitecture(second) == pynvml.NVML_DEVICE_ARCH_BLACKWELL
    assert pynvml.nvmlDeviceGetCudaComputeCapability(second) == (10, 0)
    assert pynvml.nvmlDeviceGetBrand(second) == pynvml.NVML_BRAND_TESLA


@pytest.mark.parametrize(("field", "call"), [
    ("minor_number", pynvml.nvmlDeviceGetMinorNumber),
    ("pci_bus_id", pynvml.nvmlDeviceGetPciInfo),
    ("architecture", pynvml.nvmlDeviceGetArchitecture),
    ("cuda_compute_capability", pynvml.nvmlDeviceGetCudaComputeCapability),
    ("brand", pynvml.nvmlDeviceGetBrand),
    ("mig_mode", pynvml.nvmlDeviceGetMigMode),
    ("max_mig_devices", pynvml.nvmlDeviceGetMaxMigDeviceCount),
])
def test_a_field_the_state_file_lacks_is_not_supported(gpus: FakeGpuState, field: str, call) -> None:
    gpus.state["gpus"][0].pop(field)
    gpus.write()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        call(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_a_name_the_fake_does_not_know_makes_the_file_unparsable(gpus: FakeGpuState) -> None:
    gpus.state["gpus"][0]["architecture"] = "fermi-ish"
    gpus.write()
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetArchitecture(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_mig_on_is_beyond_the_fake_and_says_so(gpus: FakeGpuState) -> None:
    gpus.state["gpus"][0]["mig_mode"] = 1
    gpus.write()
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_an_xid_error_written_to_the_state_reaches_the_event_set_registered_for_that_gpu(gpus: FakeGpuState) -> None:
    gpus.xid_error(UUIDS[1], 13)  # before registration: never delivered, as with a real driver
    second = pynvml.nvmlDeviceGetHandleByUUID(UUIDS[1])
    supported = pynvml.nvmlDeviceGetSupportedEventTypes(second)
    assert supported == pynvml.nvmlEventTypeXidCriticalError
    events = pynvml.nvmlEventSetCreate()
    try:
        for handle in (pynvml.nvmlDeviceGetHandleByIndex(0), second):
            pynvml.nvmlDeviceRegisterEvents(handle, supported, events)
        with pytest.raises(pynvml.NVMLError_NotSupported):  # ECC events: not something the fake can raise
            pynvml.nvmlDeviceRegisterEvents(second, pynvml.nvmlEventTypeDoubleBitEccError, events)
        started = time.monotonic()
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait(events, 300)
        assert 0.25 < time.monotonic() - started < 5
        gpus.xid_error(UUIDS[1], 79)
        event = pynvml.nvmlEventSetWait(events, 5000)
        assert (event.eventType, event.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
        assert pynvml.nvmlDeviceGetUUID(event.device) == UUIDS[1]
        with pytest.raises(pynvml.NVMLError_Timeout):  # delivered once
            pynvml.nvmlEventSetWait(events, 100)
    finally:
        pynvml.nvmlEventSetFree(events)


def test_init_counts_as_nvmls_does(tmp_path) -> None:
    """Each nvmlInit holds the library until its own nvmlShutdown (NVIDIA's device plugin's health check inits and
    shuts down beside the plugin's own init). In a fresh process: this one's count is shared by every test."""
    state = FakeGpuState(tmp_path / "nvml.json").gpu(UUIDS[0])
    program = f"""
import ctypes
nvml = ctypes.CDLL({str(fake_nvml_library())!r})
count = ctypes.c_uint()
results = [nvml.nvmlInit_v2(), nvml.nvmlInit_v2(), nvml.nvmlShutdown(), nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)),
           nvml.nvmlShutdown(), nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), nvml.nvmlShutdown()]
print(results, count.value)
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True,
                         env={"GPUFRAC_FAKE_NVML": str(state.path)}).stdout
    assert out.split("]")[0] + "]" == "[0, 0, 0, 0, 0, 1, 1]" and out.split()[-1] == "1"


def test_a_call_the_fake_does_not_make_fails_loudly(gpus: FakeGpuState) -> None:
    """No catch-all: what neither gpufrac nor NVIDIA's components were found to call is absent from the library."""
    for call, *args in ((pynvml.nvmlDeviceGetSerial, pynvml.nvmlDeviceGetHandleByIndex(0)),
                        (pynvml.nvmlDeviceGetHandleByPciBusId, "00000000:2A:00.0")):
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            call(*args)
