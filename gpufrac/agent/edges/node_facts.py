"""The facts `gpufrac node-check` judges, read from this host: the runtime's version, its NRI socket, the CDI specs,
NVML, the MPS binary and sockets, the cgroup version, the container toolkit's config. Each reader returns what it
found or why not; none raises, so one missing piece never hides the others.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpufrac.agent.decide import cdi_authors
from gpufrac.agent.decide.errors import NvmlError
from gpufrac.agent.decide.model import Inventory
from gpufrac.agent.decide.node_check import CdiSpecFacts, HostFacts, Status, node_check
from gpufrac.agent.edges.cdi_specs import SPEC_SUFFIXES, spec_device_names
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import MPS_CONTROL_SOCKET, mps_pipe_dir

TOOLKIT_CONFIG = Path("/etc/nvidia-container-runtime/config.toml")
ENVVAR_WHEN_UNPRIVILEGED = "accept-nvidia-visible-devices-envvar-when-unprivileged"
COMMAND_TIMEOUT = 10.0


@dataclass(frozen=True)
class Where:
    """Where to look (node-check's flags; the agent's own settings at its start)."""

    modes: tuple[ComputeMode, ...]
    nri_enabled: bool = True
    nri_socket: Path = Path("/var/run/nri/nri.sock")
    cdi_dirs: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))
    containerd: str = "containerd"
    cri_socket: Path | None = None
    crictl: str = "crictl"
    mps_binary: str = "nvidia-cuda-mps-control"
    mps_root: Path = Path("/run/gpufrac/mps")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    toolkit_config: Path = TOOLKIT_CONFIG
    nvml: bool = True  # False: skip NVML (the caller has the inventory)


def gather(where: Where, inventory: Inventory | None = None, nvml_error: str = "") -> HostFacts:
    runtime, source, runtime_error = runtime_version(where)
    nri_answers, nri_error = probe_socket(where.nri_socket)
    if where.nvml and inventory is None:
        inventory, nvml_error = read_inventory()
    env_unprivileged = toolkit_env_unprivileged(where.toolkit_config)
    return HostFacts(
        modes=where.modes, nri_enabled=where.nri_enabled,
        runtime=runtime, runtime_source=source, runtime_error=runtime_error,
        nri_socket=str(where.nri_socket), nri_answers=nri_answers, nri_error=nri_error,
        cdi_dirs=tuple(map(str, where.cdi_dirs)), cdi_specs=tuple(cdi_specs(where.cdi_dirs)),
        inventory=inventory, nvml_error=nvml_error,
        mps_binary=find_binary(where.mps_binary), mps_binary_wanted=where.mps_binary,
        mps_daemons={mode: is_socket(Path(mps_pipe_dir(str(where.mps_root), mode)) / MPS_CONTROL_SOCKET)
                     for mode in where.modes},
        cgroup_version=cgroup_version(where.cgroup_root),
        toolkit_config=str(where.toolkit_config) if env_unprivileged is not None else "",
        toolkit_env_unprivileged=env_unprivileged,
    )


# ---- the runtime ----

def runtime_version(where: Where) -> tuple[str, str, str]:
    """(runtime and version, where it was read, why not): from the CRI socket through crictl when one is named,
    else from the containerd binary."""
    if where.cri_socket is not None:
        return _crictl_version(where.crictl, where.cri_socket)
    if not where.containerd:  # the agent: no runtime binary in its container; its NRI plugin learns the version
        return "", "", "not read at start; the NRI plugin logs it when it registers"
    output, error = _run([where.containerd, "--version"])
    if error:
        return "", "", error
    return output.strip(), f"{where.containerd} --version", ""


def _crictl_version(crictl: str, cri_socket: Path) -> tuple[str, str, str]:
    output, error = _run([crictl, "--runtime-endpoint", f"unix://{cri_socket}", "version"])
    if error:
        return "", "", error
    fields = dict(line.split(":", 1) for line in output.splitlines() if ":" in line)
    name, version = fields.get("RuntimeName", "").strip(), fields.get("RuntimeVersion", "").strip()
    if not name or not version:
        return "", "", f"crictl version named no runtime: {output.strip()[:200]!r}"
    return f"{name} {version}", f"CRI Version at {cri_socket}", ""


def _run(command: Sequence[str]) -> tuple[str, str]:
    """(stdout, "") or ("", why it failed)."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    except FileNotFoundError:
        return "", f"{command[0]} not found"
    except (OSError, subprocess.TimeoutExpired) as err:
        return "", f"{command[0]}: {err}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]  # the error; crictl warns about its config first
        return "", f"{' '.join(command)} exited {done.returncode}: {last[:300]}"
    return done.stdout, ""


# ---- sockets and files ----

def is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def probe_socket(path: Path) -> tuple[bool, str]:
    """Whether something accepts connections at this unix socket (connected, then closed at once)."""
    if not is_socket(path):
        return False, "no socket there"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError as err:
            return False, f"refuses connections: {err.strerror or err}"
    return True, ""


def find_binary(name: str) -> str:
    if os.sep in name:
        return name if os.access(name, os.X_OK) else ""
    return shutil.which(name) or ""


def cgroup_version(root: Path) -> int | None:
    """2 where the unified hierarchy is mounted at the root (its cgroup.controllers), 1 where v1 controllers are."""
    if (root / "cgroup.controllers").exists():
        return 2
    return 1 if root.is_dir() and any(root.iterdir()) else None


def toolkit_env_unprivileged(config: Path) -> bool | None:
    """The toolkit's accept-nvidia-visible-devices-envvar-when-unprivileged (true when unset: its default); None
    where there is no readable config."""
    try:
        data = tomllib.loads(config.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    value = data.get(ENVVAR_WHEN_UNPRIVILEGED, True)
    return value if isinstance(value, bool) else True


# ---- CDI specs ----

def cdi_specs(dirs: Sequence[Path]) -> list[CdiSpecFacts]:
    found = []
    for directory in dirs:
        try:
            entries = sorted(p for p in directory.iterdir() if p.suffix in SPEC_SUFFIXES)
        except OSError:
            continue
        found += [read_spec(path) for path in entries]
    return found


def read_spec(path: Path) -> CdiSpecFacts:
    try:
        text = path.read_text()
        spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        names = spec_device_names(spec)
    except (OSError, ValueError, yaml.YAMLError) as err:
        return CdiSpecFacts(str(path), error=str(err).splitlines()[0][:200] if str(err) else type(err).__name__)
    return cdi_authors.describe(str(path), spec, names)


# ---- NVML ----

def read_inventory() -> tuple[Inventory | None, str]:
    try:
        from gpufrac.agent.edges.nvml import NvmlSource
    except ImportError as err:  # pynvml missing: not the image or the venv
        return None, str(err)
    source = NvmlSource()
    try:
        return source.inventory(), ""
    except NvmlError as err:
        return None, str(err)
    finally:
        source.close()


def log_node_check(where: Where, logger: logging.Logger) -> bool:
    """Run the node check as the agent starts and log it: each failure and warning with what to do, the modes'
    verdicts in one line. Returns whether every enabled mode is enforceable; never raises."""
    try:
        report = node_check(gather(where))
    except Exception as err:  # the check informs; it must never keep the agent from starting
        logger.warning("node check could not run: %s", err)
        return False
    for check in report.checks:
        if check.status in (Status.FAIL, Status.WARN):
            logger.warning("node check: %s %s: %s%s", check.name, check.status, check.found,
                           f"; {check.action}" if check.action else "")
    verdicts = ", ".join(f"{v.mode}: {v.enforcement if v.enforceable else 'not enforceable'}" for v in report.modes)
    logger.info("node check (gpufrac node-check): %s", verdicts or "no mode enabled")
    return report.ok
