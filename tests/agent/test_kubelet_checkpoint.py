"""The kubelet's device checkpoint: parsed (gpufrac.agent.decide.kubelet_allocations), read from disk
(gpufrac.agent.edges.kubelet_checkpoint) with every failure a logged line, and used by the NRI plugin at each
container creation, through the runtime stand-in."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from gpufrac.agent.decide.kubelet_allocations import NO_ALLOCATIONS, CheckpointError, parse_checkpoint
from gpufrac.agent.edges.kubelet_checkpoint import KubeletCheckpoint
from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.decide.creation import ContainerInfo, Injection, NodeFacts, Outcome, Refusal, RefusalReason
from gpufrac.agent.nri.stubs import api_pb2
from gpufrac.agent.nri.wire import container_info
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, UUID_B, gpu_info
from testkit.nri_plugin import RecordingSink, halt_plugin, start_plugin
from testkit.nri_runtime import FakeRuntime, nri_container, pod_sandbox

# As a 1.36 kubelet wrote it for a pod with one GPU of NVIDIA's device plugin (time-slicing replicas, two NUMA
# nodes), an init container with a GPU, and a pod of another vendor's resource; AllocResp shortened.
KUBELET_1_36 = {
    "Data": {
        "PodDeviceEntries": [
            {"PodUID": "pod-1", "ContainerName": "cuda", "ResourceName": "nvidia.com/gpu",
             "DeviceIDs": {"0": [f"{UUID_A}::0"], "1": [f"{UUID_B}::4"]}, "AllocResp": "CiQKFk5WSURJQQ=="},
            {"PodUID": "pod-1", "ContainerName": "cuda", "ResourceName": "nvidia.com/mig-1g.18gb",
             "DeviceIDs": {"-1": ["MIG-0f0e"]}, "AllocResp": "Cg=="},
            {"PodUID": "pod-1", "ContainerName": "init", "ResourceName": "nvidia.com/gpu",
             "DeviceIDs": {"-1": [UUID_A]}, "AllocResp": "Cg=="},
            {"PodUID": "pod-2", "ContainerName": "fpga", "ResourceName": "example.com/fpga",
             "DeviceIDs": {"-1": ["fpga-0"]}, "AllocResp": "Cg=="},
        ],
        "RegisteredDevices": {"nvidia.com/gpu": [f"{UUID_A}::0", f"{UUID_B}::4"], "example.com/fpga": ["fpga-0"]},
    },
    "Checksum": 1946318244,
}


def test_the_kubelets_checkpoint_per_container_with_replicas_folded() -> None:
    allocations = parse_checkpoint(json.dumps(KUBELET_1_36).encode())
    assert allocations.problem is None
    assert allocations.of("pod-1", "cuda") == {UUID_A, UUID_B, "MIG-0f0e"}
    assert allocations.of("pod-1", "init") == {UUID_A}
    assert allocations.of("pod-2", "fpga") == frozenset()  # not NVIDIA's
    assert allocations.of("pod-3", "cuda") == frozenset()


# The bytes k8s.io/kubernetes v1.36.3's own checkpoint.New(entries, devices).MarshalCheckpoint() wrote (a Go program
# against the module cache): the format is the kubelet's, not a transcription of it.
BY_THE_KUBELETS_CODE = (
    '{"Data":{"PodDeviceEntries":[{"PodUID":"pod-1","ContainerName":"cuda","ResourceName":"nvidia.com/gpu'
    '","DeviceIDs":{"0":["GPU-a::0"],"1":["GPU-b::4"]},"AllocResp":"CiQK"},{"PodUID":"pod-2","ContainerNa'
    'me":"fpga","ResourceName":"example.com/fpga","DeviceIDs":{"-1":["fpga-0"]},"AllocResp":""}],"Registe'
    'redDevices":{"nvidia.com/gpu":["GPU-a::0","GPU-b::4"]}},"Checksum":1991908945}'
)
EMPTY_BY_THE_KUBELETS_CODE = '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":3467439661}'


def test_what_the_kubelets_own_code_writes() -> None:
    allocations = parse_checkpoint(BY_THE_KUBELETS_CODE)
    assert allocations.devices == {("pod-1", "cuda"): {"GPU-a", "GPU-b"}}  # replicas ::0 and ::4 folded
    assert parse_checkpoint(EMPTY_BY_THE_KUBELETS_CODE).devices == {}


def test_an_empty_checkpoint_and_the_v1_format() -> None:
    empty = parse_checkpoint('{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":0}')
    assert empty.devices == {} and empty.problem is None
    v1 = {"Data": {"PodDeviceEntries": [{"PodUID": "p", "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
                                         "DeviceIDs": [UUID_B], "AllocResp": ""}]}, "Checksum": 1}
    assert parse_checkpoint(json.dumps(v1)).of("p", "c") == {UUID_B}


@pytest.mark.parametrize(("text", "says"), [
    (b"\xff\xfe", "not JSON"),
    ("{", "not JSON"),
    ("[]", "no `Data` object"),
    ('{"Data": {"PodDeviceEntries": {}}}', "`Data.PodDeviceEntries` is not a list"),
    ('{"Data": {"PodDeviceEntries": [1]}}', "`Data.PodDeviceEntries[0]` is not an object"),
    ('{"Data": {"PodDeviceEntries": [{"PodUID": "p", "ResourceName": "nvidia.com/gpu"}]}}',
     "lacks one of PodUID, ContainerName, ResourceName"),
    ('{"Data": {"PodDeviceEntries": [{"PodUID": "p", "ContainerName": "c", "ResourceName": "nvidia.com/gpu", '
     '"DeviceIDs": "GPU-a"}]}}', "DeviceIDs is neither a map"),
    ('{"Data": {"PodDeviceEntries": [{"PodUID": "p", "ContainerName": "c", "ResourceName": "nvidia.com/gpu", '
     '"DeviceIDs": {"0": [1]}}]}}', "holds something other than device ID strings"),
])
def test_what_is_not_a_checkpoint_is_said_in_one_line(text: str | bytes, says: str) -> None:
    with pytest.raises(CheckpointError, match=re.escape(says)) as caught:
        parse_checkpoint(text)
    assert "\n" not in str(caught.value)


def test_the_file_on_disk_every_way_it_can_fail(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "gpufrac.agent.edges.kubelet_checkpoint")
    plugins = tmp_path / "device-plugins"
    reader = KubeletCheckpoint(plugins / "kubelet_internal_checkpoint")
    gone = reader.allocations()  # the directory not mounted: unknown
    assert gone.problem is not None and "is not there" in gone.problem
    plugins.mkdir()
    assert reader.allocations() == NO_ALLOCATIONS  # no device plugin ever registered: nothing allocated
    reader.path.write_text("{not json")
    assert "does not parse: not JSON" in (reader.allocations().problem or "")
    assert reader.allocations().problem is not None  # said once, not at each creation
    _replace(reader.path, json.dumps(KUBELET_1_36))  # the kubelet writes a temporary file and renames it
    assert reader.allocations().of("pod-1", "init") == {UUID_A}
    reader.path.unlink()
    reader.path.mkdir()  # unreadable as a file
    assert "is not readable" in (reader.allocations().problem or "")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    said = ["is not there", "does not parse: not JSON", "is not readable: Is a directory"]
    assert len(warnings) == len(said) and all(s in w.getMessage() for s, w in zip(said, warnings, strict=True))
    assert sum("reads again" in r.getMessage() for r in caplog.records) == 2
    assert all(r.exc_info is None for r in caplog.records)  # never a traceback


def _replace(path: Path, text: str) -> None:
    temporary = path.with_name(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def test_a_new_checkpoint_is_read_at_the_next_creation(tmp_path: Path) -> None:
    reader = KubeletCheckpoint(tmp_path / "kubelet_internal_checkpoint")
    _replace(reader.path, '{"Data":{"PodDeviceEntries":null},"Checksum":0}')
    assert reader.allocations().of("pod-1", "cuda") == frozenset()
    _replace(reader.path, json.dumps(KUBELET_1_36))  # same second, new inode
    assert reader.allocations().of("pod-1", "cuda") == {UUID_A, UUID_B, "MIG-0f0e"}


def test_the_runtime_tells_the_container_annotations_cdi_devices_and_mounts() -> None:
    pod = pod_sandbox("p", "u1", {})
    message = nri_container("c1", "cuda", pod, {"NVIDIA_VISIBLE_DEVICES": "void"})
    message.annotations["cdi.k8s.io/nvidia-device-plugin_1"] = f"k8s.device-plugin.nvidia.com/gpu={UUID_A}"
    message.CDI_devices.add(name=f"k8s.device-plugin.nvidia.com/gpu={UUID_B}")
    message.mounts.add(destination="/var/run/nvidia-container-devices/x", source="/dev/null", type="bind")
    assert container_info(message) == ContainerInfo(
        "c1", "cuda", {"NVIDIA_VISIBLE_DEVICES": "void"},
        {"cdi.k8s.io/nvidia-device-plugin_1": f"k8s.device-plugin.nvidia.com/gpu={UUID_A}"},
        (f"k8s.device-plugin.nvidia.com/gpu={UUID_B}",), ("/var/run/nvidia-container-devices/x",))


def test_the_plugin_leaves_the_kubelets_allocation_and_voids_a_plain_pod(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path / "nri.sock")
    (tmp_path / "device-plugins").mkdir()
    checkpoint = tmp_path / "device-plugins" / "kubelet_internal_checkpoint"
    config = NriConfig(runtime.path, lock_file=tmp_path / "lock", device_checkpoint=checkpoint)
    sink = RecordingSink()
    facts = NodeFacts((gpu_info(0, UUID_A), gpu_info(1, UUID_B)), frozenset(), {}, dict.fromkeys(ComputeMode))
    plugin, stop, thread = start_plugin(config, sink, facts)
    try:
        runtime.accept()
        runtime.handshake()
        whole = pod_sandbox("whole", "pod-1", {})
        env = {"NVIDIA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"}
        # before the kubelet allocated (no checkpoint yet): a plain pod's env, voided
        assert _env_adjusted(runtime.create(whole, nri_container("c0", "cuda", whole, env))) == {
            "NVIDIA_VISIBLE_DEVICES": "void"}
        _replace(checkpoint, json.dumps(KUBELET_1_36))
        assert _env_adjusted(runtime.create(whole, nri_container("c1", "cuda", whole, env))) == {}
        plain = pod_sandbox("plain", "pod-9", {})
        assert _env_adjusted(runtime.create(plain, nri_container("c2", "cuda", plain, env))) == {
            "NVIDIA_VISIBLE_DEVICES": "void"}
        checkpoint.write_text("garbage")
        refused = runtime.create(whole, nri_container("c3", "cuda", whole, env))
        assert refused.status.code == 9 and "does not parse" in refused.status.message
        outcomes = [(cid, r.outcome if isinstance(r, Injection) else r.reason) for cid, r in sink.decisions]
        assert outcomes == [("c0", Outcome.VOIDED), ("c1", Outcome.UNTOUCHED), ("c2", Outcome.VOIDED),
                            ("c3", RefusalReason.ALLOCATION_UNKNOWN)]
        assert isinstance(sink.decisions[-1][1], Refusal)
    finally:
        halt_plugin(plugin, stop, thread)
        runtime.close()


def _env_adjusted(answer: object) -> dict[str, str]:
    assert answer.status.code == 0, answer.status.message  # type: ignore[attr-defined]
    adjust = api_pb2.CreateContainerResponse.FromString(answer.payload).adjust  # type: ignore[attr-defined]
    return {e.key: e.value for e in adjust.env}
