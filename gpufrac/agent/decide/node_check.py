"""`gpufrac node-check`: what this node can enforce, and for each thing it cannot, why and what to do. Pure: the
facts come from gpufrac/agent/edges/node_facts.py; the agent runs the same check at start and logs it.

Each check is ok, info, warn (works, with a risk or a missing extra) or fail (blocks the modes it names). A mode is
enforceable when no failing check blocks it; the command exits 0 only when every enabled mode is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufrac.agent.decide import runtime_support as rs
from gpufrac.agent.decide.capabilities import (
    MIN_DRIVER_MAJOR,
    cuda_version_text,
    has_driver_memory_limits,
)
from gpufrac.agent.decide.model import Inventory
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import Enforcement

MEMORY_LIMIT_HOOK = "apply-cuda-memory-limits"  # the toolkit's nvidia-cdi-hook that applies CUDA 13.4 limits


class Status(StrEnum):
    OK = "ok"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"


class Author(StrEnum):
    """Who wrote a CDI spec, from its kind and hooks."""

    TOOLKIT = "nvidia-ctk"  # NVIDIA's container toolkit (`nvidia-ctk cdi generate`, the GPU Operator)
    DEVICE_PLUGIN = "k8s-device-plugin"  # NVIDIA's device plugin (deviceListStrategy cdi-*)
    GPUFRAC = "gpufrac"
    OTHER = "other"  # by hand, or another tool


@dataclass(frozen=True)
class CdiSpecFacts:
    path: str
    kind: str = ""
    devices: tuple[str, ...] = ()  # fully qualified names, `kind=name`
    author: Author = Author.OTHER
    memory_limit_hook: bool = False  # a device edit runs nvidia-cdi-hook apply-cuda-memory-limits
    error: str = ""  # why it could not be read ("" when it was)


@dataclass(frozen=True)
class HostFacts:
    """Everything node-check looks at. Empty strings and None mean "not found" or "could not be read"."""

    modes: tuple[ComputeMode, ...]
    nri_enabled: bool = True  # the agent runs its NRI plugin (chart nri.enabled)
    runtime: str = ""  # "containerd v2.4.2", as read from `source`
    runtime_source: str = ""
    runtime_error: str = ""
    nri_socket: str = ""
    nri_answers: bool = False  # something accepts connections on nri_socket
    nri_error: str = ""
    cdi_dirs: tuple[str, ...] = ()
    cdi_specs: tuple[CdiSpecFacts, ...] = ()
    inventory: Inventory | None = None
    nvml_error: str = ""
    mps_binary: str = ""  # the control binary's path where found
    mps_binary_wanted: str = "nvidia-cuda-mps-control"
    mps_daemons: Mapping[ComputeMode, bool] = field(default_factory=dict)  # control socket present
    cgroup_version: int | None = None
    toolkit_config: str = ""  # the toolkit's config.toml where found
    toolkit_env_unprivileged: bool | None = None  # accept-nvidia-visible-devices-envvar-when-unprivileged


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    found: str
    action: str = ""  # what to do (warn and fail)
    blocks: tuple[ComputeMode, ...] = ()  # the modes a failure makes unenforceable


@dataclass(frozen=True)
class ModeVerdict:
    mode: ComputeMode
    enforceable: bool
    enforcement: Enforcement  # how, when enforceable
    why_not: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    checks: tuple[Check, ...]
    modes: tuple[ModeVerdict, ...]

    @property
    def ok(self) -> bool:
        return all(m.enforceable for m in self.modes)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "modes": [{"mode": str(m.mode), "enforceable": m.enforceable,
                       "enforcement": str(m.enforcement), "whyNot": list(m.why_not)} for m in self.modes],
            "checks": [{"name": c.name, "status": str(c.status), "found": c.found, "action": c.action,
                        "blocks": [str(m) for m in c.blocks]} for c in self.checks],
        }


def node_check(facts: HostFacts) -> Report:
    checks = [
        _runtime(facts), _nri(facts), *_cdi(facts), _driver(facts), _mps_binary(facts), _mps_daemons(facts),
        _memory_limit_hook(facts), _toolkit(facts), _cgroup(facts),
    ]
    return Report(tuple(checks), tuple(_verdict(mode, facts, checks) for mode in facts.modes))


def _verdict(mode: ComputeMode, facts: HostFacts, checks: list[Check]) -> ModeVerdict:
    why_not = tuple(f"{c.name}: {c.found}" for c in checks if c.status is Status.FAIL and mode in c.blocks)
    if why_not or facts.inventory is None:
        return ModeVerdict(mode, False, Enforcement.NONE, why_not)
    driver = has_driver_memory_limits(facts.inventory)
    return ModeVerdict(mode, True, Enforcement.DRIVER if driver else Enforcement.MPS)


def _runtime(facts: HostFacts) -> Check:
    runtime = rs.parse_runtime(facts.runtime)
    if runtime is None:
        return Check("runtime", Status.WARN, f"unknown ({facts.runtime_error or 'no version read'})",
                     "run node-check on the node (containerd on PATH), or name the runtime's CRI socket "
                     "(--cri-socket) or binary (--containerd)")
    found = f"{runtime} (from {facts.runtime_source})" if facts.runtime_source else str(runtime)
    if not rs.drops_nri_cdi(runtime):
        return Check("runtime", Status.OK, found)
    if facts.nri_enabled and facts.nri_answers:
        return Check("runtime", Status.FAIL, f"{found}: drops the CDI devices NRI plugins inject",
                     f"{rs.UPGRADE_CONTAINERD}; until then fractional containers here would start without their GPU",
                     blocks=facts.modes)
    return Check("runtime", Status.WARN, f"{found}: NRI plugins cannot hand out CDI devices before containerd 2.1",
                 f"{rs.UPGRADE_CONTAINERD} and enable NRI (docs/install.md)")


def _nri(facts: HostFacts) -> Check:
    if not facts.nri_enabled:
        return Check("nri", Status.INFO, "the agent's NRI plugin is off (nri.enabled=false)")
    if facts.nri_answers:
        return Check("nri", Status.OK, f"{facts.nri_socket} answers")
    return Check("nri", Status.WARN, f"no NRI at {facts.nri_socket} ({facts.nri_error or 'absent'}): fractional "
                 "containers get their GPU through NVIDIA_VISIBLE_DEVICES, which any pod may set",
                 "enable NRI in containerd 2.1+ ([plugins.'io.containerd.nri.v1.nri'], on by default in 2.x) or set "
                 "nri.socketPath to its socket; docs/install.md, the env-var fallback")


def _cdi(facts: HostFacts) -> list[Check]:
    checks = [_cdi_spec(spec) for spec in facts.cdi_specs]
    if not facts.cdi_specs:
        checks.append(Check("cdi", Status.INFO, f"no CDI spec in {', '.join(facts.cdi_dirs) or 'the CDI dirs'}"))
    names = frozenset(name for spec in facts.cdi_specs for name in spec.devices)
    gpus = facts.inventory.gpus if facts.inventory is not None else ()
    missing = rs.gpus_without_cdi(gpus, names)
    if missing:
        blocking = facts.nri_enabled and facts.nri_answers
        checks.append(Check("cdi coverage", Status.FAIL if blocking else Status.WARN,
                            f"no CDI device names GPU(s) {rs.describe_gpus(missing)}"
                            + (": fractions there would get bare device nodes" if blocking else ""),
                            rs.CDI_GENERATE, blocks=facts.modes if blocking else ()))
    elif gpus:
        checks.append(Check("cdi coverage", Status.OK, f"every GPU ({len(gpus)}) has a CDI device"))
    return checks


def _cdi_spec(spec: CdiSpecFacts) -> Check:
    if spec.error:
        return Check("cdi spec", Status.WARN, f"{spec.path}: unreadable ({spec.error})",
                     "fix or remove it: containerd cannot resolve its devices either")
    hook = f", hook {MEMORY_LIMIT_HOOK}" if spec.memory_limit_hook else ""
    return Check("cdi spec", Status.INFO,
                 f"{spec.path}: kind {spec.kind}, {len(spec.devices)} device(s), written by {spec.author}{hook}")


def _driver(facts: HostFacts) -> Check:
    inventory = facts.inventory
    if inventory is None:
        return Check("driver", Status.FAIL, f"NVML unavailable ({facts.nvml_error or 'unknown error'})",
                     "load the NVIDIA driver; in a pod, run with the NVIDIA runtime (agent.runtimeClassName)",
                     blocks=facts.modes)
    found = (f"{inventory.driver_version} (CUDA {cuda_version_text(inventory.cuda_driver_version)}), "
             f"{len(inventory.gpus)} GPU(s)")
    if not inventory.gpus:
        return Check("driver", Status.FAIL, f"{found}: NVML reports no GPUs", "check the driver and device nodes",
                     blocks=facts.modes)
    if has_driver_memory_limits(inventory):
        return Check("driver", Status.OK, f"{found}: r{MIN_DRIVER_MAJOR}+, CUDA 13.4 memory limits")
    blocked = tuple(m for m in facts.modes if m is ComputeMode.TIME_SLICING)
    return Check("driver", Status.FAIL if blocked else Status.INFO,
                 f"{found}: before r{MIN_DRIVER_MAJOR}, no CUDA 13.4 memory limits: time-slicing is not enforceable, "
                 "sm-sharing is (MPS pinned memory limits)",
                 f"upgrade to r{MIN_DRIVER_MAJOR}+ for time-slicing, or serve sm-sharing only (agent.modes)"
                 if blocked else "", blocks=blocked)


def _mps_binary(facts: HostFacts) -> Check:
    if facts.mps_binary:
        return Check("mps", Status.OK, f"control binary {facts.mps_binary}")
    return Check("mps", Status.FAIL, f"no {facts.mps_binary_wanted}: no MPS control daemon can run",
                 "install the driver's MPS binaries, or run node-check where the agent runs (its image and the "
                 "NVIDIA runtime provide them)", blocks=facts.modes)


def _mps_daemons(facts: HostFacts) -> Check:
    up = [str(m) for m in facts.modes if facts.mps_daemons.get(m)]
    down = [str(m) for m in facts.modes if not facts.mps_daemons.get(m)]
    if not down:
        return Check("mps daemons", Status.OK, f"up: {', '.join(up)}")
    return Check("mps daemons", Status.INFO, f"no control socket for {', '.join(down)}"
                 + (f" (up: {', '.join(up)})" if up else "") + ": the agent starts them; if it runs, see its "
                 "gpufrac.io/Ready condition")


def _memory_limit_hook(facts: HostFacts) -> Check:
    specs = [spec.path for spec in facts.cdi_specs if spec.memory_limit_hook]
    if specs and facts.cgroup_version == 1:
        # the hook refuses cgroup v1 whenever the container's env has NVIDIA_GPU_MEMORY_*, as every fraction's has
        return Check("toolkit memory-limit hook", Status.FAIL,
                     f"{MEMORY_LIMIT_HOOK} in {', '.join(specs)} on cgroup v1: it fails the creation of every "
                     "container with NVIDIA_GPU_MEMORY_REQUEST/LIMIT in its env, which every fraction has",
                     f"regenerate the spec with `nvidia-ctk cdi generate --disable-hook={MEMORY_LIMIT_HOOK}` "
                     "(NVIDIA's switch), or move the node to cgroup v2", blocks=facts.modes)
    if specs:
        return Check("toolkit memory-limit hook", Status.INFO,
                     f"{MEMORY_LIMIT_HOOK} in {', '.join(specs)}: it applies NVIDIA_GPU_MEMORY_LIMIT at creation "
                     "(driver r615+); gpufrac's limits hold with or without it")
    return Check("toolkit memory-limit hook", Status.INFO,
                 f"no CDI spec runs {MEMORY_LIMIT_HOOK} (toolkit before GPU Operator v26.7.1, or not generated)")


def _toolkit(facts: HostFacts) -> Check:
    if facts.toolkit_env_unprivileged is None:
        return Check("toolkit", Status.INFO, f"no container toolkit config read{_at(facts.toolkit_config)}")
    setting = "default" if facts.toolkit_env_unprivileged else "hardened"
    found = (f"{facts.toolkit_config}: accept-nvidia-visible-devices-envvar-when-unprivileged = "
             f"{str(facts.toolkit_env_unprivileged).lower()} ({setting})")
    env_fallback = not (facts.nri_enabled and facts.nri_answers)
    if env_fallback and not facts.toolkit_env_unprivileged:
        return Check("toolkit", Status.FAIL, f"{found}, and no NRI: fractional containers would get no GPU",
                     "enable NRI (containerd 2.1+), or accept the env var (docs/install.md: its risk)",
                     blocks=facts.modes)
    if not env_fallback and facts.toolkit_env_unprivileged:
        return Check("toolkit", Status.WARN, f"{found}: any pod may take a GPU by its env where the agent does not "
                     "void it", "set it to false (the NRI plugin delivers fractions without the env var)")
    return Check("toolkit", Status.OK, found)


def _at(path: str) -> str:
    return f" ({path})" if path else ""


def _cgroup(facts: HostFacts) -> Check:
    if facts.cgroup_version == 2:
        return Check("cgroup", Status.OK, "v2")
    if facts.cgroup_version == 1:
        return Check("cgroup", Status.INFO, "v1: no dmem controller, so no MPS v3 soft/hard limits on the "
                     "container's cgroup; MPS and driver limits hold")
    return Check("cgroup", Status.INFO, "unknown")


def render_table(report: Report) -> str:
    """The report as a person reads it: modes first, then every check, each problem with what to do."""
    lines = ["MODE          ENFORCEABLE  HOW     WHY NOT"]
    for verdict in report.modes:
        lines.append(f"{verdict.mode!s:<13} {'yes' if verdict.enforceable else 'NO':<12} "
                     f"{verdict.enforcement!s:<7} {'; '.join(verdict.why_not) or '-'}")
    width = max(len(c.name) for c in report.checks)
    lines += ["", f"{'CHECK':<{width}}  STATUS  FOUND"]
    for check in report.checks:
        lines.append(f"{check.name:<{width}}  {check.status.upper():<6}  {check.found}")
        if check.action:
            lines.append(f"{'':<{width}}          -> {check.action}")
    verdict_line = ("every enabled mode is enforceable" if report.ok
                    else "not every enabled mode is enforceable: see the checks marked FAIL")
    return "\n".join([*lines, "", verdict_line]) + "\n"
