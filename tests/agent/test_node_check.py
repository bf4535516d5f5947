"""`gpufrac node-check`'s decisions (gpufrac.agent.decide.node_check, runtime_support, cdi_authors), table-driven:
which modes a node can enforce from its facts, and each problem with what to do."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufrac.agent.decide import capabilities
from gpufrac.agent.decide.cdi_authors import author, has_memory_limit_hook
from gpufrac.agent.decide.model import DaemonState, DaemonStatus, Inventory
from gpufrac.agent.decide.node_check import (
    Author,
    CdiSpecFacts,
    Check,
    HostFacts,
    Report,
    Status,
    node_check,
    render_table,
)
from gpufrac.agent.decide.runtime_support import (
    DeliveryFacts,
    delivery_refusal,
    parse_runtime,
    runtime_problem_event,
    runtime_problems,
)
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import Enforcement
from testkit.agent import UUID_A, UUID_B, gpu_info

GPUS = (gpu_info(0, UUID_A), gpu_info(1, UUID_B))
R615 = Inventory("615.20", 13040, GPUS)
R580 = Inventory("580.95.05", 13000, GPUS)
TOOLKIT_SPEC = CdiSpecFacts("/var/run/cdi/nvidia.yaml", "nvidia.com/gpu",
                            ("nvidia.com/gpu=0", f"nvidia.com/gpu={UUID_A}", "nvidia.com/gpu=1",
                             f"nvidia.com/gpu={UUID_B}", "nvidia.com/gpu=all"), Author.TOOLKIT, True)
BOTH = tuple(ComputeMode)
HEALTHY = HostFacts(
    modes=BOTH, runtime="containerd github.com/containerd/containerd/v2 v2.4.2 deadbeef",
    runtime_source="containerd --version", nri_socket="/var/run/nri/nri.sock", nri_answers=True,
    cdi_dirs=("/etc/cdi", "/var/run/cdi"), cdi_specs=(TOOLKIT_SPEC,), inventory=R615,
    mps_binary="/usr/bin/nvidia-cuda-mps-control", mps_daemons=dict.fromkeys(BOTH, True), cgroup_version=2,
    toolkit_config="/etc/nvidia-container-runtime/config.toml", toolkit_env_unprivileged=False,
)


def check(report: Report, name: str) -> Check:
    return next(c for c in report.checks if c.name == name)


def test_a_healthy_node_enforces_every_mode_by_the_driver() -> None:
    report = node_check(HEALTHY)
    assert report.ok
    assert [(m.mode, m.enforceable, m.enforcement) for m in report.modes] == [
        (ComputeMode.TIME_SLICING, True, Enforcement.DRIVER), (ComputeMode.SM_SHARING, True, Enforcement.DRIVER)]
    assert {c.status for c in report.checks} <= {Status.OK, Status.INFO}
    assert check(report, "runtime").found == "containerd 2.4.2 (from containerd --version)"
    assert "hardened" in check(report, "toolkit").found
    assert "apply-cuda-memory-limits in /var/run/cdi/nvidia.yaml" in check(report, "toolkit memory-limit hook").found
    assert "written by nvidia-ctk" in check(report, "cdi spec").found


PROBLEMS = [
    # (id, facts, failing check, modes still enforceable, words of the finding, words of the action)
    ("containerd-2.0-with-nri", replace(HEALTHY, runtime="containerd containerd.io 2.0.5 abc"), "runtime", (),
     "containerd 2.0.5", "upgrade containerd to 2.1"),
    ("no-cdi-spec", replace(HEALTHY, cdi_specs=()), "cdi coverage", (), f"GPU(s) 0 ({UUID_A}), 1 ({UUID_B})",
     "nvidia-ctk cdi generate"),
    ("one-gpu-without-cdi", replace(HEALTHY, cdi_specs=(replace(TOOLKIT_SPEC, devices=("nvidia.com/gpu=0",)),)),
     "cdi coverage", (), f"1 ({UUID_B})", "nvidia-ctk cdi generate"),
    ("driver-580", replace(HEALTHY, inventory=R580), "driver", (ComputeMode.SM_SHARING,), "580.95.05",
     "serve sm-sharing only (agent.modes)"),
    ("nvml-down", replace(HEALTHY, inventory=None, nvml_error="NVML: Driver Not Loaded"), "driver", (),
     "Driver Not Loaded", "agent.runtimeClassName"),
    ("no-mps-binary", replace(HEALTHY, mps_binary=""), "mps", (), "no nvidia-cuda-mps-control",
     "install the driver's MPS binaries"),
    ("memory-limit-hook-on-cgroup-v1", replace(HEALTHY, cgroup_version=1), "toolkit memory-limit hook", (),
     "on cgroup v1: it fails the creation of every container", "--disable-hook=apply-cuda-memory-limits"),
    ("hardened-toolkit-without-nri", replace(HEALTHY, nri_answers=False, nri_error="no socket there"), "toolkit",
     (), "no NRI: fractional containers would get no GPU", "enable NRI"),
]


@pytest.mark.parametrize(("facts", "name", "enforceable", "found", "action"), [p[1:] for p in PROBLEMS],
                         ids=[p[0] for p in PROBLEMS])
def test_each_problem_fails_what_it_blocks_and_says_what_to_do(facts: HostFacts, name: str,
                                                               enforceable: tuple[ComputeMode, ...], found: str,
                                                               action: str) -> None:
    report = node_check(facts)
    failed = check(report, name)
    assert failed.status is Status.FAIL
    assert found in failed.found and action in failed.action
    assert tuple(m.mode for m in report.modes if m.enforceable) == enforceable
    assert not report.ok
    for verdict in report.modes:
        assert verdict.enforceable or any(v.startswith(f"{name}: ") for v in verdict.why_not)


def test_a_580_driver_still_enforces_sm_sharing_by_mps_and_only_it_is_enabled_is_ok() -> None:
    report = node_check(replace(HEALTHY, inventory=R580, modes=(ComputeMode.SM_SHARING,)))
    assert report.ok
    assert [(m.mode, m.enforcement) for m in report.modes] == [(ComputeMode.SM_SHARING, Enforcement.MPS)]
    assert check(report, "driver").status is Status.INFO


WARNINGS = [
    ("no-nri-default-toolkit", replace(HEALTHY, nri_answers=False, nri_error="no socket there",
                                       toolkit_env_unprivileged=True), "nri", "any pod may set"),
    ("containerd-1.7-without-nri", replace(HEALTHY, runtime="containerd containerd.io 1.7.27 05044ec",
                                           nri_answers=False, toolkit_env_unprivileged=True), "runtime",
     "before containerd 2.1"),
    ("default-toolkit-with-nri", replace(HEALTHY, toolkit_env_unprivileged=True), "toolkit", "by its env"),
    ("unknown-runtime", replace(HEALTHY, runtime="", runtime_error="containerd not found"), "runtime",
     "containerd not found"),
    ("broken-spec", replace(HEALTHY, cdi_specs=(TOOLKIT_SPEC, CdiSpecFacts("/etc/cdi/x.json", error="bad"))),
     "cdi spec", "unreadable (bad)"),
]


@pytest.mark.parametrize(("facts", "name", "found"), [w[1:] for w in WARNINGS], ids=[w[0] for w in WARNINGS])
def test_risks_warn_but_leave_the_modes_enforceable(facts: HostFacts, name: str, found: str) -> None:
    report = node_check(facts)
    warned = [c for c in report.checks if c.name == name and c.status is Status.WARN]
    assert warned and found in warned[0].found and warned[0].action
    assert report.ok


def test_without_the_nri_plugin_cdi_gaps_and_old_containerd_do_not_block() -> None:
    facts = replace(HEALTHY, nri_enabled=False, runtime="containerd 2.0.5", cdi_specs=(),
                    toolkit_env_unprivileged=True)
    report = node_check(facts)
    assert report.ok
    assert check(report, "nri").status is Status.INFO
    assert check(report, "cdi coverage").status is Status.WARN


def test_the_table_names_each_mode_each_check_and_each_action() -> None:
    text = render_table(node_check(replace(HEALTHY, inventory=R580)))
    lines = text.splitlines()
    assert lines[0].split() == ["MODE", "ENFORCEABLE", "HOW", "WHY", "NOT"]
    assert lines[1].startswith("time-slicing  NO") and "driver: 580.95.05" in lines[1]
    assert lines[2].startswith("sm-sharing    yes          mps")
    assert any(line.strip() == "-> upgrade to r615+ for time-slicing, or serve sm-sharing only (agent.modes)"
               for line in lines)
    assert lines[-1] == "not every enabled mode is enforceable: see the checks marked FAIL"


def test_the_json_report_carries_the_same() -> None:
    data = node_check(replace(HEALTHY, runtime="containerd v2.0.0")).to_json()
    assert data["ok"] is False
    assert data["modes"][0] == {"mode": "time-slicing", "enforceable": False, "enforcement": "none",
                                "whyNot": [data["modes"][0]["whyNot"][0]]}
    runtime = data["checks"][0]
    assert runtime["name"] == "runtime" and runtime["status"] == "fail"
    assert runtime["blocks"] == ["time-slicing", "sm-sharing"]


RUNTIMES = [
    ("containerd github.com/containerd/containerd/v2 v2.4.2 2f1e7ab", ("containerd", (2, 4, 2))),
    ("containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da", ("containerd", (1, 7, 27))),
    ("containerd://2.0.5", ("containerd", (2, 0, 5))),
    ("containerd v2.1.0-rc.1", ("containerd", (2, 1, 0))),
    ("cri-o://1.30.1", ("cri-o", (1, 30, 1))),
    ("containerd", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), RUNTIMES)
def test_runtime_versions_are_read_from_every_source(text: str, expected: tuple[str, tuple[int, ...]] | None) -> None:
    parsed = parse_runtime(text)
    assert (None if parsed is None else (parsed.name, parsed.version)) == expected


def test_the_agents_condition_problems() -> None:
    cdi = frozenset(TOOLKIT_SPEC.devices)
    assert runtime_problems("containerd v2.4.2", GPUS, cdi) == []
    assert runtime_problems("cri-o 1.30.1", GPUS, cdi) == []
    old = runtime_problems("containerd v2.0.5", GPUS, cdi)
    assert [reason for reason, _ in old] == ["ContainerdTooOld"]
    assert "containerd 2.0.5 drops the CDI devices" in old[0][1] and "upgrade containerd to 2.1" in old[0][1]
    missing = runtime_problems("containerd v2.4.2", GPUS, frozenset({"nvidia.com/gpu=0"}), ("/etc/cdi",))
    assert missing == [("NoCdiSpecForGpu", missing[0][1])]
    assert f"no CDI spec in /etc/cdi names GPU(s) 1 ({UUID_B})" in missing[0][1]
    # the device plugin's kind counts, by UUID
    assert runtime_problems("containerd v2.4.2", GPUS, frozenset(
        {f"k8s.device-plugin.nvidia.com/gpu={UUID_A}", f"k8s.device-plugin.nvidia.com/gpu={UUID_B}"})) == []


def test_a_runtime_problem_makes_the_condition_kai_reads_false() -> None:
    daemons = {m: DaemonStatus(m, DaemonState.RUNNING, up=True, restarts=0) for m in BOTH}
    enforced = capabilities.enforcement(R615, BOTH, daemons)
    problems = runtime_problems("containerd v2.0.5", GPUS, frozenset())
    condition = capabilities.node_condition(R615, BOTH, enforced, daemons, runtime_problems=problems)
    assert (condition.status, condition.reason) == ("False", "ContainerdTooOld")
    assert "NoCdiSpecForGpu" not in condition.message and "nvidia-ctk cdi generate" in condition.message
    assert capabilities.node_condition(R615, BOTH, enforced, daemons).reason == "FractionsEnforced"


REFUSALS = [
    # (id, CDI devices given, GPUs as bare device nodes, facts, reason or None, words)
    ("unknown-runtime-facts", (), (UUID_B,), None, None, ""),
    ("cdi-on-2.4", (f"nvidia.com/gpu={UUID_B}",), (), DeliveryFacts("containerd v2.4.2"), None, ""),
    ("cdi-on-2.0", (f"nvidia.com/gpu={UUID_B}",), (), DeliveryFacts("containerd v2.0.5"), "GPURuntimeDropsCdi",
     "which containerd 2.0.5 drops"),
    ("bare-node", (), (UUID_B,), DeliveryFacts("containerd v2.4.2"), "GPUWithoutCdiSpec", "nvidia-ctk cdi generate"),
    ("bare-node-allowed", (), (UUID_B,), DeliveryFacts("containerd v2.4.2", device_nodes_allowed=True), None, ""),
    ("bare-node-on-2.0", (), (UUID_B,), DeliveryFacts("containerd v2.0.5"), "GPUWithoutCdiSpec", UUID_B),
]


@pytest.mark.parametrize(("cdi", "bare", "facts", "reason", "words"), [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_a_fraction_that_would_get_no_working_gpu_is_refused(cdi: tuple[str, ...], bare: tuple[str, ...],
                                                             facts: DeliveryFacts | None, reason: str | None,
                                                             words: str) -> None:
    refusal = delivery_refusal(cdi, bare, facts)
    assert (None if refusal is None else refusal[0]) == reason
    assert refusal is None or words in refusal[1]


def test_the_node_event_is_named_by_its_problem() -> None:
    first = runtime_problem_event("gpu-1", "ContainerdTooOld", "containerd 2.0.5 drops ...")
    again = runtime_problem_event("gpu-1", "ContainerdTooOld", "containerd 2.0.5 drops ...")
    assert first["metadata"]["name"] == again["metadata"]["name"]
    assert first["involvedObject"]["kind"] == "Node" and first["type"] == "Warning"
    assert first["reason"] == "ContainerdTooOld"


def _toolkit_spec(hook_args: list[str]) -> dict[str, object]:
    hook = {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": hook_args}
    return {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": "0", "containerEdits": {"hooks": [hook]}}],
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}}


AUTHORS = [
    ("toolkit", _toolkit_spec(["nvidia-cdi-hook", "apply-cuda-memory-limits", "--gpu-id", "0"]), Author.TOOLKIT,
     True),
    ("toolkit-without-hook", _toolkit_spec(["nvidia-cdi-hook", "update-ldcache"]), Author.TOOLKIT, False),
    ("old-toolkit", {"kind": "nvidia.com/gpu", "devices": [], "containerEdits": {"hooks": [
        {"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook", "chmod"]}]}},
     Author.TOOLKIT, False),
    ("device-plugin", {"kind": "k8s.device-plugin.nvidia.com/gpu", "devices": []}, Author.DEVICE_PLUGIN, False),
    ("gpufrac", {"kind": "gpufrac.io/gpu", "devices": []}, Author.GPUFRAC, False),
    ("hand-made", {"kind": "nvidia.com/gpu", "devices": [{"name": "0"}]}, Author.OTHER, False),
]


@pytest.mark.parametrize(("spec", "expected", "hook"), [a[1:] for a in AUTHORS], ids=[a[0] for a in AUTHORS])
def test_who_wrote_a_cdi_spec(spec: dict[str, object], expected: Author, hook: bool) -> None:
    assert author(spec) is expected
    assert has_memory_limit_hook(spec) is hook
