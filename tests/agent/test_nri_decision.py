"""The NRI plugin's decision (gpufrac.agent.nri.decide.creation), table-driven: what each container gets at creation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.decide.creation import (
    MARK,
    ContainerInfo,
    DeviceNode,
    Injection,
    NodeFacts,
    Outcome,
    PodInfo,
    Policy,
    Refusal,
    RefusalReason,
    ServingContainer,
    decide,
    gpu_identity,
    serving_container,
)
from gpufrac.agent.nri.decide.sweep import unserved
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, UUID_B, canonical_annotations, container, gpu_info, injected_env

GPUS = (gpu_info(0, UUID_A), gpu_info(1, UUID_B))
CDI = frozenset({
    "nvidia.com/gpu=0", "nvidia.com/gpu=1", f"nvidia.com/gpu={UUID_A}", f"nvidia.com/gpu={UUID_B}",
    "nvidia.com/gpu=all", f"k8s.device-plugin.nvidia.com/gpu={UUID_A}", f"k8s.device-plugin.nvidia.com/gpu={UUID_B}",
})
NODES = {
    "/dev/nvidia0": DeviceNode("/dev/nvidia0", 195, 0),
    "/dev/nvidia1": DeviceNode("/dev/nvidia1", 195, 1),
    "/dev/nvidiactl": DeviceNode("/dev/nvidiactl", 195, 255),
    "/dev/nvidia-uvm": DeviceNode("/dev/nvidia-uvm", 510, 0),
}
SERVED = dict.fromkeys(ComputeMode)
CDI_NODE = NodeFacts(GPUS, CDI, NODES, SERVED)
PLAIN_NODE = NodeFacts(GPUS, frozenset(), NODES, SERVED)


def fractional(devices: str = UUID_B, mode: str = "time-slicing", *, name: str = "app", uid: str = "u1",
               pod: str = "infer", env: dict[str, str] | None = None, extra: dict[str, str] | None = None,
               ) -> tuple[PodInfo, ContainerInfo]:
    """A pod the webhook admitted and the scheduler bound, and its fractional container with the env the kubelet
    resolved from the webhook's fieldRefs."""
    entries = devices.split(",")
    annotations = canonical_annotations(name, request_mib=2048, limit_mib=4096, devices=entries, mode=mode)
    running = container(name, mode=ComputeMode(mode), request_mib=2048, limit_mib=4096, devices=tuple(entries))
    return (PodInfo("team-a", pod, uid, {**annotations, **(extra or {})}),
            ContainerInfo("c-" + name, name, injected_env(running) if env is None else env))


def plain(env: dict[str, str], annotations: dict[str, str] | None = None, name: str = "app") -> tuple[PodInfo,
                                                                                                   ContainerInfo]:
    return PodInfo("team-a", "plain", "u9", annotations or {}), ContainerInfo("c9", name, env)


CASES = [
    # (id, pod and container, node, expected CDI devices, expected device nodes)
    ("uuid-to-device-plugin-cdi", fractional(UUID_B), CDI_NODE, (f"k8s.device-plugin.nvidia.com/gpu={UUID_B}",), ()),
    ("index-to-cdi-by-uuid", fractional("1"), CDI_NODE, (f"k8s.device-plugin.nvidia.com/gpu={UUID_B}",), ()),
    ("cdi-name-as-written", fractional("nvidia.com/gpu=1"), CDI_NODE, ("nvidia.com/gpu=1",), ()),
    ("two-gpus", fractional(f"{UUID_A},{UUID_B}"), CDI_NODE,
     (f"k8s.device-plugin.nvidia.com/gpu={UUID_A}", f"k8s.device-plugin.nvidia.com/gpu={UUID_B}"), ()),
    ("device-nodes-without-cdi", fractional(UUID_B), PLAIN_NODE, (),
     ("/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm")),
    ("index-device-node", fractional("0"), PLAIN_NODE, (), ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")),
]


@pytest.mark.parametrize(("pod_container", "node", "cdi", "nodes"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_fraction_gets_exactly_its_devices(pod_container: tuple[PodInfo, ContainerInfo], node: NodeFacts,
                                             cdi: tuple[str, ...], nodes: tuple[str, ...]) -> None:
    pod, ctr = pod_container
    result = decide(pod, ctr, node)
    assert isinstance(result, Injection), result
    assert result.outcome is Outcome.INJECTED
    assert result.cdi_devices == cdi
    assert tuple(n.path for n in result.device_nodes) == nodes
    # its limit env is the webhook's, checked, not rewritten, but the pinned limit: keyed by the bound GPUs' UUIDs
    assert set(result.set_env) <= {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"} and result.remove_env == ()
    pinned = result.set_env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "GPU-")
    assert all(key.startswith("GPU-") for key in pinned.split(","))
    assert result.serving is not None and result.serving.container_id == ctr.id


def test_the_device_node_carries_the_hosts_numbers() -> None:
    result = decide(*fractional("1"), PLAIN_NODE)
    assert isinstance(result, Injection)
    assert result.device_nodes[0] == DeviceNode("/dev/nvidia1", 195, 1)


NO_GPU_CASES = [
    ("nothing-asked", plain({"PATH": "/bin"}), Outcome.UNTOUCHED, {}, ()),
    ("all-voided", plain({"NVIDIA_VISIBLE_DEVICES": "all"}), Outcome.VOIDED, {"NVIDIA_VISIBLE_DEVICES": "void"}, ()),
    ("uuid-voided", plain({"NVIDIA_VISIBLE_DEVICES": UUID_A}), Outcome.VOIDED, {"NVIDIA_VISIBLE_DEVICES": "void"}, ()),
    ("void-kept", plain({"NVIDIA_VISIBLE_DEVICES": "void"}), Outcome.UNTOUCHED, {}, ()),
    ("none-kept", plain({"NVIDIA_VISIBLE_DEVICES": "none"}), Outcome.UNTOUCHED, {}, ()),
    ("mig-grant-removed", plain({"NVIDIA_MIG_CONFIG_DEVICES": "all"}), Outcome.VOIDED, {},
     ("NVIDIA_MIG_CONFIG_DEVICES",)),
    # the second, non-fractional container of a fractional pod
    ("sidecar-of-a-fraction", (fractional()[0], ContainerInfo("c2", "sidecar", {"NVIDIA_VISIBLE_DEVICES": "all"})),
     Outcome.VOIDED, {"NVIDIA_VISIBLE_DEVICES": "void"}, ()),
    ("sidecar-with-webhooks-void",
     (fractional()[0], ContainerInfo("c2", "sidecar", {"NVIDIA_VISIBLE_DEVICES": "void"})),
     Outcome.UNTOUCHED, {}, ()),
]


@pytest.mark.parametrize(("pod_container", "outcome", "set_env", "remove_env"), [c[1:] for c in NO_GPU_CASES],
                         ids=[c[0] for c in NO_GPU_CASES])
def test_any_other_container_gets_no_gpu(pod_container: tuple[PodInfo, ContainerInfo], outcome: Outcome,
                                         set_env: dict[str, str], remove_env: tuple[str, ...]) -> None:
    result = decide(*pod_container, CDI_NODE)
    assert isinstance(result, Injection), result
    assert (result.outcome, dict(result.set_env), result.remove_env) == (outcome, set_env, remove_env)
    assert result.cdi_devices == () and result.device_nodes == () and result.serving is None


def _serving(mode: ComputeMode, gpu: str = UUID_B, uid: str = "u-other") -> ServingContainer:
    return ServingContainer("c-other", "team-b", "train", uid, "main", mode, (gpu,))


REFUSALS = [
    ("forged-gpus-devices", plain({"NVIDIA_VISIBLE_DEVICES": UUID_B},
                                  {"nvidia.com/container.app.gpus.devices": UUID_B}), CDI_NODE,
     RefusalReason.NOT_ADMITTED, "nvidia.com/container.app.gpus.devices"),
    ("shorthand-without-webhook", plain({}, {"gpu-fraction": "0.5"}), CDI_NODE,
     RefusalReason.NOT_ADMITTED, "gpu-fraction"),
    ("forged-key-beside-an-admitted-fraction",
     (fractional(extra={"nvidia.com/container.side.gpus.devices": UUID_A})[0], ContainerInfo("c2", "side", {})),
     CDI_NODE, RefusalReason.NOT_ADMITTED, "gpufrac.io/container.side.*"),
    ("unparsable-canonical", (PodInfo("team-a", "p", "u", {"gpufrac.io/container.app.gpu-memory.limit-mib": "4Gi",
                                                           "gpufrac.io/container.app.compute-mode": "time-slicing"}),
                              ContainerInfo("c", "app", {})), CDI_NODE, RefusalReason.UNREADABLE, "4Gi"),
    ("not-bound", (PodInfo("team-a", "p", "u", canonical_annotations("app", request_mib=1, limit_mib=1, devices=[])),
                   ContainerInfo("c", "app", {})), CDI_NODE, RefusalReason.NOT_BOUND, "gpus.devices is missing"),
    ("mode-not-enforced", fractional(mode="sm-sharing"),
     replace(CDI_NODE, not_served={ComputeMode.SM_SHARING: "its MPS control daemon is backoff"}),
     RefusalReason.MODE_NOT_ENFORCED, "sm-sharing GPU fraction, which this node does not enforce now: its MPS"),
    ("unknown-uuid", fractional("GPU-ffffffff-0000-0000-0000-00000000000f"), CDI_NODE, RefusalReason.UNKNOWN_DEVICE,
     "names GPU-ffffffff-0000-0000-0000-00000000000f, which this node does not have"),
    ("unknown-cdi-name", fractional("k8s.device-plugin.nvidia.com/gpu=GPU-ffff"), CDI_NODE,
     RefusalReason.UNKNOWN_DEVICE, "k8s.device-plugin.nvidia.com/gpu=GPU-ffff"),
    ("no-device-node", fractional("1"), replace(PLAIN_NODE, device_nodes={}), RefusalReason.UNKNOWN_DEVICE, "names 1"),
    ("other-mode-on-the-gpu", fractional(mode="sm-sharing"),
     replace(CDI_NODE, serving=(_serving(ComputeMode.TIME_SLICING),)),
     RefusalReason.MODE_CONFLICT, f"GPU {UUID_B} serves time-slicing to container main of pod team-b/train"),
    ("other-mode-same-gpu-by-index", fractional("nvidia.com/gpu=1", mode="sm-sharing"),
     replace(CDI_NODE, serving=(_serving(ComputeMode.TIME_SLICING),)), RefusalReason.MODE_CONFLICT,
     "serves time-slicing"),
    ("limit-env-wrong", fractional(env={**injected_env(container(devices=(UUID_B,), request_mib=2048, limit_mib=4096)),
                                        "NVIDIA_GPU_MEMORY_LIMIT": "80000"}), CDI_NODE,
     RefusalReason.LIMIT_ENV_MISMATCH, "NVIDIA_GPU_MEMORY_LIMIT=80000 (expected 4096)"),
    ("limit-env-missing", fractional(env={"NVIDIA_VISIBLE_DEVICES": UUID_B}), CDI_NODE,
     RefusalReason.LIMIT_ENV_MISMATCH, "CUDA_MPS_PIPE_DIRECTORY missing"),
    ("visible-devices-other-gpu", fractional(env={**injected_env(container(devices=(UUID_B,), request_mib=2048,
                                                                           limit_mib=4096)),
                                                  "NVIDIA_VISIBLE_DEVICES": UUID_A}), CDI_NODE,
     RefusalReason.LIMIT_ENV_MISMATCH, f"NVIDIA_VISIBLE_DEVICES={UUID_A}"),
]


@pytest.mark.parametrize(("pod_container", "node", "reason", "says"), [c[1:] for c in REFUSALS],
                         ids=[c[0] for c in REFUSALS])
def test_refusals_name_the_reason(pod_container: tuple[PodInfo, ContainerInfo], node: NodeFacts,
                                  reason: RefusalReason, says: str) -> None:
    result = decide(*pod_container, node)
    assert isinstance(result, Refusal), result
    assert result.reason is reason
    assert says in result.message
    assert f"pod team-a/{pod_container[0].name}" in result.message


def test_the_same_mode_shares_a_gpu_and_the_own_pod_does_not_conflict() -> None:
    same = replace(CDI_NODE, serving=(_serving(ComputeMode.TIME_SLICING),))
    assert isinstance(decide(*fractional(), same), Injection)
    own_pod = replace(CDI_NODE, serving=(_serving(ComputeMode.SM_SHARING, uid="u1"),))
    assert isinstance(decide(*fractional(uid="u1"), own_pod), Injection)
    other_gpu = replace(CDI_NODE, serving=(_serving(ComputeMode.SM_SHARING, gpu=UUID_A),))
    assert isinstance(decide(*fractional(), other_gpu), Injection)


def test_a_fraction_without_nvml_still_resolves_cdi_names_and_holds_them_by_id() -> None:
    node = replace(CDI_NODE, gpus=())
    result = decide(*fractional(UUID_B), node)
    assert isinstance(result, Injection)
    assert result.cdi_devices == (f"k8s.device-plugin.nvidia.com/gpu={UUID_B}",)
    assert result.serving is not None and result.serving.gpus == (UUID_B,)


def test_gpu_identity_is_one_string_whatever_the_spelling() -> None:
    spellings = ["1", UUID_B, "nvidia.com/gpu=1", f"k8s.device-plugin.nvidia.com/gpu={UUID_B}"]
    assert {gpu_identity(s, GPUS) for s in spellings} == {UUID_B}


def test_serving_container_reads_what_a_running_fraction_holds() -> None:
    pod, ctr = fractional("nvidia.com/gpu=1", mode="sm-sharing")
    held = serving_container(pod, ctr, GPUS)
    assert held == ServingContainer(ctr.id, "team-a", "infer", "u1", "app", ComputeMode.SM_SHARING, (UUID_B,))
    assert serving_container(*plain({}), GPUS) is None


def test_trusted_namespaces_and_the_policy_leave_env_grants_alone() -> None:
    pod, ctr = plain({"NVIDIA_VISIBLE_DEVICES": "all"})
    gpu_stack = Policy(trusted_namespaces=frozenset({"gpu-operator"}))
    assert decide(replace(pod, namespace="gpu-operator"), ctr, CDI_NODE, gpu_stack) == Injection(Outcome.UNTOUCHED)
    assert decide(pod, ctr, CDI_NODE, gpu_stack).outcome is Outcome.VOIDED
    assert decide(pod, ctr, CDI_NODE, Policy(void_env_grants=False)) == Injection(Outcome.UNTOUCHED)
    # a fraction in a trusted namespace is still a fraction
    assert decide(*fractional(), CDI_NODE, Policy(trusted_namespaces=frozenset({"team-a"}))).outcome is Outcome.INJECTED


def test_the_nri_plugin_refuses_an_annotated_fraction_on_a_gpu_served_through_dra() -> None:
    pod, container = fractional(UUID_B)
    held = replace(CDI_NODE, dra_gpus={UUID_B: "ResourceClaim team/claim-1 is prepared on it"})
    result = decide(pod, container, held)
    assert isinstance(result, Refusal) and result.reason is RefusalReason.SERVED_THROUGH_DRA
    assert result.message.startswith("container app of pod team-a/infer is an annotated GPU fraction, but GPU "
                                     f"{UUID_B} is served through DRA (ResourceClaim team/claim-1")
    assert "gpufrac.io/front-door is annotations" in result.message
    # the same fraction on the other GPU, or with nothing served through DRA, is injected
    assert isinstance(decide(*fractional(UUID_A), held), Injection)
    assert isinstance(decide(pod, container, CDI_NODE), Injection)
    # whatever the entry's spelling: an index names the same GPU
    assert isinstance(decide(*fractional("1"), held), Refusal)


# ---- back after being away: which fractions were created without the plugin (nri_sweep) ----

AWAY_SINCE = 1_800_000_000.0


def created(pair: tuple[PodInfo, ContainerInfo], at: float, **annotations: str) -> tuple[PodInfo, ContainerInfo]:
    pod, info = pair
    return pod, replace(info, created_at=at, annotations=annotations)


def test_an_injected_fraction_carries_the_plugins_mark() -> None:
    result = decide(*fractional(), CDI_NODE)
    given = f"k8s.device-plugin.nvidia.com/gpu={UUID_B}"  # the device plugin's CDI name, where its spec has one
    assert isinstance(result, Injection) and result.annotations == {MARK: f"time-slicing {given}"}
    untouched = decide(*plain({}), CDI_NODE)
    assert isinstance(untouched, Injection) and untouched.annotations == {}


@pytest.mark.parametrize(("pair", "stopped"), [
    (created(fractional(), AWAY_SINCE + 5), True),  # a bound fraction created while away, without the mark
    (created(fractional(), AWAY_SINCE + 5, **{MARK: "time-slicing GPU-b"}), False),  # through the plugin
    (created(fractional(), AWAY_SINCE - 5), False),  # before the plugin went away
    (created(fractional(), 0.0), False),  # the runtime did not tell when: never stopped
    (created(plain({}), AWAY_SINCE + 5), False),  # no fraction
    (created((PodInfo("team-a", "p", "u", canonical_annotations("app", request_mib=1, limit_mib=1, devices=[])),
              ContainerInfo("c", "app", {})), AWAY_SINCE + 5), False),  # not bound yet: it holds no GPU
])
def test_a_fraction_created_while_the_plugin_was_away_is_stopped(pair: tuple[PodInfo, ContainerInfo],
                                                                  stopped: bool) -> None:
    found = unserved([pair], AWAY_SINCE)
    assert [u.container.id for u in found] == ([pair[1].id] if stopped else [])
    if stopped:
        assert found[0].message.startswith("container app of pod team-a/infer is a time-slicing GPU fraction created "
                                           "at 2027-01-15T08:00:05Z, while the gpufrac NRI plugin was away (from about "
                                           "2027-01-15T08:00:00Z)")
    assert unserved([pair], None) == []  # since when is not known: nothing is stopped


def judged(pod: PodInfo, info: ContainerInfo) -> Outcome:
    return decide(pod, info, CDI_NODE, Policy(trusted_namespaces=frozenset({"nvidia-device-plugin"}))).outcome


@pytest.mark.parametrize(("pair", "stopped"), [
    (created(plain({"NVIDIA_VISIBLE_DEVICES": "all"}), AWAY_SINCE + 5), True),  # its env may have had every GPU
    (created(plain({"NVIDIA_VISIBLE_DEVICES": "void"}), AWAY_SINCE + 5), False),  # voided: by the plugin, or itself
    (created(plain({"MODEL": "small"}), AWAY_SINCE + 5), False),  # asked for no GPU
    (created(plain({"NVIDIA_VISIBLE_DEVICES": "all"}), AWAY_SINCE - 5), False),  # before the plugin went away
    ((PodInfo("nvidia-device-plugin", "dp", "u7", {}),  # the GPU stack's own keeps its env
      replace(ContainerInfo("c7", "plugin", {"NVIDIA_VISIBLE_DEVICES": "all"}), created_at=AWAY_SINCE + 5)), False),
])
def test_a_plain_container_that_asked_for_a_gpu_while_the_plugin_was_away_is_stopped(
        pair: tuple[PodInfo, ContainerInfo], stopped: bool) -> None:
    found = unserved([pair], AWAY_SINCE, judged)
    assert [u.container.id for u in found] == ([pair[1].id] if stopped else [])
    if stopped:
        assert found[0].message == (
            "container app of pod team-a/plain is no GPU fraction and its env asks for a GPU; it was created at "
            "2027-01-15T08:00:05Z, while the gpufrac NRI plugin was away (from about 2027-01-15T08:00:00Z): its env "
            "may have given it a GPU without limits, which the plugin voids")
    assert unserved([pair], AWAY_SINCE) == []  # no judge: a container that is no fraction is left alone


# ---- a single-user MPS daemon serves one UID at a time (creation_escapes.mps_user_conflict, row 5) ----

def as_user(pair: tuple[PodInfo, ContainerInfo], uid: int | None) -> tuple[PodInfo, ContainerInfo]:
    return pair[0], replace(pair[1], uid=uid)


def serving(mode: ComputeMode, uid: int | None, pod: str = "other") -> ServingContainer:
    return ServingContainer(f"c-{pod}", "team-a", pod, f"u-{pod}", "app", mode, (UUID_A,), uid)


@pytest.mark.parametrize(("mode", "uid", "held", "multi_user", "refused"), [
    ("time-slicing", 1000, serving(ComputeMode.TIME_SLICING, 0), frozenset(), True),
    ("time-slicing", 0, serving(ComputeMode.TIME_SLICING, 0), frozenset(), False),  # the same UID
    ("time-slicing", None, serving(ComputeMode.TIME_SLICING, 0), frozenset(), False),  # its UID not told
    ("time-slicing", 1000, serving(ComputeMode.TIME_SLICING, None), frozenset(), False),  # theirs not told
    ("time-slicing", 1000, serving(ComputeMode.SM_SHARING, 0), frozenset(), False),  # the other mode's daemon
    ("sm-sharing", 1000, serving(ComputeMode.SM_SHARING, 0), frozenset({ComputeMode.SM_SHARING}), False),  # -m
    ("sm-sharing", 1000, serving(ComputeMode.SM_SHARING, 0), frozenset(), True),  # a legacy daemon
])
def test_a_single_user_mps_daemon_refuses_a_fraction_of_another_uid(
        mode: str, uid: int | None, held: ServingContainer, multi_user: frozenset[ComputeMode], refused: bool) -> None:
    node = replace(CDI_NODE, serving=(held,), multi_user_modes=multi_user)
    result = decide(*as_user(fractional(mode=mode), uid), node)
    if not refused:
        assert isinstance(result, Injection) and result.serving is not None and result.serving.uid == uid
        return
    assert isinstance(result, Refusal) and result.reason is RefusalReason.MPS_USER_CONFLICT
    assert result.message == (
        f"container app of pod team-a/infer runs as UID 1000, but this node's {mode} MPS daemon serves one user at a "
        "time and serves UID 0 (container app of pod team-a/other): MPS would hold its CUDA calls until every client "
        "of that UID has exited; run it as that UID (securityContext.runAsUser), or on another node")


def nvidia_device_plugin(namespace: str, sources: tuple[str, ...] = ()) -> tuple[PodInfo, ContainerInfo]:
    """NVIDIA's device plugin as its README installs it: `NVIDIA_VISIBLE_DEVICES=all` in its image's ENV and in its
    DaemonSet's env (the runtime holds both entries), no GPU requested."""
    entries = ("NVIDIA_VISIBLE_DEVICES=all", "PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all")
    ctr = ContainerInfo("c1", "nvidia-device-plugin-ctr", {"NVIDIA_VISIBLE_DEVICES": "all"},
                        mounts=("/var/lib/kubelet/device-plugins",) if sources else (), env_entries=entries,
                        mount_sources=sources)
    return PodInfo(namespace, "nvidia-device-plugin-daemonset-x7k2p", "u2", {}), ctr


def test_nvidia_s_device_plugin_keeps_its_env_in_its_own_namespace_under_the_default_policy() -> None:
    default = Policy(trusted_namespaces=NriConfig().trusted_namespaces)
    for namespace in ("nvidia-device-plugin", "gpu-operator", "nvidia-gpu-operator", "kube-system"):
        assert decide(*nvidia_device_plugin(namespace), CDI_NODE, default) == Injection(Outcome.UNTOUCHED), namespace
    # elsewhere, the same container without the kubelet's directory is no stack: its env would be voided, and
    # written twice it is refused (what the default did to NVIDIA's plugin before)
    refused = decide(*nvidia_device_plugin("team-a"), CDI_NODE, default)
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.ENV_DUPLICATED


def test_a_container_binding_the_kubelet_s_device_plugins_directory_is_the_gpu_stack_anywhere() -> None:
    default = Policy(trusted_namespaces=NriConfig().trusted_namespaces)
    for source in ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins/",
                   "/var/lib/kubelet/device-plugins/kubelet.sock"):
        assert decide(*nvidia_device_plugin("dcgm", (source,)), CDI_NODE, default) == Injection(Outcome.UNTOUCHED)
    # a look-alike path is not the kubelet's directory
    lookalike = decide(*nvidia_device_plugin("dcgm", ("/var/lib/kubelet/device-plugins-not",)), CDI_NODE, default)
    assert isinstance(lookalike, Refusal)


@pytest.mark.parametrize("mark", ["gpufrac.io/tolerate-missing-nri-plugin", "gpufrac.io/nri-served"])
def test_gpufracs_own_marks_ask_for_no_gpu(mark: str) -> None:
    """containerd's tolerate annotation (the chart's `nri.tolerateMissingPluginsAnnotation`, on the agent's and the
    MPS daemons' pods and on the node's other DaemonSets) is under gpufrac.io/ but outside the per-container grammar:
    a container of such a pod is no unadmitted fraction (the MPS pods were refused GPUFractionNotAdmitted when the
    plugin was up at their creation)."""
    pod, c = plain({}, {mark: "true"})
    result = decide(pod, c, CDI_NODE)
    assert isinstance(result, Injection), result
    forged = decide(*plain({}, {mark: "true", "nvidia.com/container.app.gpus.devices": UUID_B}), CDI_NODE)
    assert isinstance(forged, Refusal) and forged.reason is RefusalReason.NOT_ADMITTED, forged
