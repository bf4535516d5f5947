"""A node for the agent end to end: fake GPUs, a fake /proc, the real `gpufrac agent` process, and fractional
pods created through the real admission path on a local control plane (e2e.cluster.ControlPlane).

Used by tests/e2e/test_agent_e2e.py and `make agent-demo`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.cluster import ControlPlane
from e2e.names import NODE_NAME, REPO_ROOT, USER_NAMESPACE
from e2e.toolkit.procs import Proc, free_port, spawn
from e2e.toolkit.server import start_server
from testkit.fakes.build import MPS_CONTROL, fake_nvml_dir
from testkit.fakes.state import FakeGpuState, ProcRoot
from testkit.pods import IMAGE, pod

GPU_UUIDS = ("GPU-e2e00000-0000-0000-0000-000000000000", "GPU-e2e11111-1111-1111-1111-111111111111")


@dataclass
class FractionalPod:
    name: str
    container_id: str
    gpu_uuid: str
    mode: str
    limit_mib: int
    request_mib: int
    uid: str = ""


class AgentWorld:
    def __init__(self, cp: ControlPlane, workdir: Path, node: str = NODE_NAME, namespace: str = USER_NAMESPACE) -> None:
        self.cp = cp
        # Where create_pod puts the next pod: a test moves it to a namespace of its own (tests/e2e/conftest.py).
        self.namespace = namespace
        self._namespace_of: dict[str, str] = {}  # pod name -> the namespace it was created in
        self.workdir = workdir
        self.node = node
        workdir.mkdir(parents=True, exist_ok=True)
        self.gpus = FakeGpuState(workdir / "nvml.json")
        for uuid in GPU_UUIDS:
            self.gpus.gpu(uuid, memory_total_mib=143771)
        self.proc = ProcRoot(workdir / "proc")
        # Live processes described here are GPU 0's (the fake NVML drops them when they exit): real processes of
        # the fake world's containers, which the agent can kill
        self.live_processes = workdir / "gpu-processes"
        self.live_processes.mkdir(exist_ok=True)
        self.mps_root = workdir / "mps"
        self.log_root = workdir / "mps-log"
        self.port = free_port()
        self.agent: Proc | None = None
        self.mps: dict[str, Proc] = {}  # `gpufrac mps` per mode (the gpufrac-mps DaemonSet's containers)
        self._next_pid = 40000
        self._next_cid = 1
        self.created: list[str] = []  # pod names, for cleanup

    # ---- the agent process ----

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(fake_nvml_dir()),
                                                             os.environ.get("LD_LIBRARY_PATH")])),
            "GPUFRAC_FAKE_NVML": str(self.gpus.path),
            "GPUFRAC_FAKE_GPU_PROCESSES": str(self.live_processes),
        }

    def start_agent(self, *extra: str) -> None:
        env = self._env()
        argv = [
            sys.executable, "-m", "gpufrac", "agent", "--node", self.node,
            "--kubeconfig", str(self.cp.kubeconfigs["admin"]),
            "--mps-binary", str(MPS_CONTROL), "--mps-root", str(self.mps_root),
            "--mps-log-root", str(self.log_root), "--mps-config-dir", str(self.workdir / "mps-config"),
            "--proc-root", str(self.proc.root), "--memory-limit-file", str(self.workdir / "memory.max"),
            "--metrics-bind", f"127.0.0.1:{self.port}", "--interval", "0.5",
            "--restart-backoff", "0.2", "--quit-timeout", "10", *extra,
        ]
        # In our session: SIGTERM goes to the agent alone, which quits its MPS daemons itself.
        self.agent = start_server("agent", argv, self.workdir / "agent.log", self._serving, timeout=60, env=env,
                                  cwd=REPO_ROOT, die_with_parent_signal=signal.SIGTERM, own_session=False)

    def start_mps(self, mode: str, *extra: str) -> Proc:
        """`gpufrac mps --mode <mode>`, as the gpufrac-mps DaemonSet's container runs it: the daemon outside the
        agent's process tree."""
        argv = [
            sys.executable, "-m", "gpufrac", "mps", "--mode", mode, "--mps-binary", str(MPS_CONTROL),
            "--mps-root", str(self.mps_root), "--mps-log-root", str(self.log_root),
            "--mps-config-dir", str(self.workdir / "mps-config"), "--quit-timeout", "10", *extra,
        ]
        # SIGTERM to it alone: it quits its daemon itself, as the container does when its pod is deleted.
        self.mps[mode] = spawn(f"mps-{mode}", argv, self.workdir / f"mps-{mode}.log", env=self._env(), cwd=REPO_ROOT,
                               die_with_parent_signal=signal.SIGTERM, own_session=False)
        return self.mps[mode]

    def stop_mps(self, mode: str, timeout: float = 30.0) -> int:
        proc = self.mps.pop(mode)
        proc.stop(timeout)
        return proc.returncode if proc.returncode is not None else 0

    def expose_daemons(self) -> None:
        """What hostPID gives the agent: the real MPS control daemons, in its (fake) /proc."""
        for mode in ("time-slicing", "sm-sharing"):
            for pid in self.live_daemons(mode):
                entry = self.proc.root / str(pid)
                if not entry.is_symlink():
                    self.expose_process(pid)

    def _serving(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop_agent(self, timeout: float = 30.0) -> int:
        if self.agent is None:
            return 0
        self.agent.stop(timeout)
        rc = self.agent.returncode
        self.agent = None
        return rc if rc is not None else 0

    def kill_agent(self) -> int:
        """SIGKILL the agent (an OOM kill, a node hiccup): no `quit` for its daemons, no AgentStopped."""
        assert self.agent is not None
        pid = self.agent.pid
        self.agent.kill()
        self.agent = None
        return pid

    def healthz(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def expose_process(self, pid: int) -> None:
        """Make a real process visible in the agent's fake /proc (a symlink to /proc/<pid>)."""
        (self.proc.root / str(pid)).symlink_to(f"/proc/{pid}")

    def live_daemons(self, mode: str) -> list[int]:
        """PIDs of recorded daemon starts of this mode's pipe directory that are still running (not zombies)."""
        return sorted({r["pid"] for r in self.daemon_records(mode) if r["event"] == "start" and _running(r["pid"])})

    def agent_log(self) -> str:
        path = self.workdir / "agent.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def readyz(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def daemon_records(self, mode: str) -> list[dict[str, Any]]:
        path = self.log_root / mode / "fake-mps-record.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def daemon_pid(self, mode: str) -> int | None:
        starts = [r for r in self.daemon_records(mode) if r["event"] == "start"]
        return starts[-1]["pid"] if starts else None

    # ---- pods, through the real admission path ----

    def _kubectl(self, user: str, *args: str, input: str | None = None) -> str:
        rc, out, err = self.cp.kubectl(*args, user=user, input=input)
        if rc != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])} as {user}: {err.strip()}")
        return out

    def create_pod(self, name: str, *, gpu_uuid: str, limit_mib: int, request_mib: int | None = None,
                   mode: str = "time-slicing", labels: dict[str, str] | None = None) -> FractionalPod:
        """alice creates it (the webhook mutates it), the binder assigns the GPU and binds it to this node."""
        request_mib = request_mib or limit_mib
        c = "nvidia.com/container.app."
        annotations = {c + "gpu-memory.request": f"{request_mib}Mi", c + "gpu-memory.limit": f"{limit_mib}Mi",
                       c + "gpu-compute.mode": mode}
        manifest = pod(annotations, name=name, namespace=self.namespace, labels=labels or {},
                       spec={"schedulerName": "kai-scheduler"})
        self._kubectl("alice", "create", "-f", "-", input=json.dumps(manifest))
        self.created.append(name)
        self._namespace_of[name] = self.namespace
        self._kubectl("binder", "patch", "pod", "-n", self.namespace, name, "--type=merge", "-p",
                      json.dumps({"metadata": {"annotations": {c + "gpus.devices": gpu_uuid}}}))
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}}
        self._kubectl("binder", "create", "--raw", f"/api/v1/namespaces/{self.namespace}/pods/{name}/binding",
                      "-f", "-", input=json.dumps(binding))
        container_id = f"{self._next_cid:064x}"
        self._next_cid += 1
        fp = FractionalPod(name, container_id, gpu_uuid, mode, limit_mib, request_mib)
        self.mark_running(fp)
        return fp

    def get_pod(self, name: str) -> dict[str, Any]:
        return json.loads(self._kubectl("admin", "get", "pod", "-n", self.namespace_of(name), name, "-o", "json"))

    def namespace_of(self, name: str) -> str:
        """The namespace of a pod this world created (the current one for any other)."""
        return self._namespace_of.get(name, self.namespace)

    def mark_running(self, fp: FractionalPod) -> None:
        """What the kubelet would write: the container running, with its runtime ID."""
        status = {"status": {"phase": "Running", "containerStatuses": [{
            "name": "app", "image": IMAGE, "imageID": "", "ready": True, "restartCount": 0, "started": True,
            "containerID": f"containerd://{fp.container_id}",
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}
        out = self._kubectl("admin", "patch", "pod", "-n", self.namespace_of(fp.name), fp.name, "--subresource=status",
                            "--type=merge", "-p", json.dumps(status), "-o", "json")
        fp.uid = json.loads(out)["metadata"]["uid"]

    def start_process(self, fp: FractionalPod, used_mib: int, sm_util: int, *,
                      env: dict[str, str] | None = None) -> int:
        """A GPU process of that container: in the fake /proc (with the env the kubelet would resolve from the
        webhook's downward-API env) and in the fake NVML process list."""
        pod = self.get_pod(fp.name)
        if env is None:
            env = resolve_env(pod, "app")
        pid = self._next_pid
        self._next_pid += 1
        self.proc.add(pid, fp.container_id, env, pod_uid=fp.uid)
        for gpu in self.gpus.state["gpus"]:
            if gpu["uuid"] == fp.gpu_uuid:
                gpu["processes"].append({"pid": pid, "used_memory_mib": used_mib, "sm_util": sm_util})
        self.gpus.write()
        return pid

    def start_live_process(self, fp: FractionalPod, used_mib: int) -> subprocess.Popen[bytes]:
        """A real process of that container on GPU 0 (the fake /proc shows its start time; NVML lists it while it
        lives). The caller reaps it (`poll`)."""
        assert fp.gpu_uuid == self.gpus.state["gpus"][0]["uuid"], "live processes are GPU 0's"
        child = subprocess.Popen(["sleep", "600"])
        self.proc.add(child.pid, fp.container_id, resolve_env(self.get_pod(fp.name), "app"), pod_uid=fp.uid,
                      real=True)
        (self.live_processes / f"{child.pid}.json").write_text(
            json.dumps({"pid": child.pid, "used_memory_mib": used_mib, "sm_util": 10}))
        return child

    def remove_process(self, pid: int) -> None:
        """NVML no longer lists it (the kubelet killed its container)."""
        for gpu in self.gpus.state["gpus"]:
            gpu["processes"] = [p for p in gpu["processes"] if p["pid"] != pid]
        self.gpus.write()

    def set_process_memory(self, pid: int, used_mib: int) -> None:
        for gpu in self.gpus.state["gpus"]:
            for process in gpu["processes"]:
                if process["pid"] == pid:
                    process["used_memory_mib"] = used_mib
        self.gpus.write()

    def events_for(self, name: str) -> list[dict[str, Any]]:
        out = self._kubectl("admin", "get", "events", "-n", self.namespace_of(name), "--field-selector",
                            f"involvedObject.name={name}", "-o", "json")
        return json.loads(out)["items"]

    def get_node(self) -> dict[str, Any]:
        return json.loads(self._kubectl("admin", "get", "node", self.node, "-o", "json"))

    def node_condition(self, condition_type: str = "gpufrac.io/Ready") -> dict[str, Any] | None:
        for cond in self.get_node().get("status", {}).get("conditions", []):
            if cond["type"] == condition_type:
                return cond
        return None

    def delete_pods(self, *names: str) -> None:
        by_namespace: dict[str, list[str]] = {}
        for name in names:
            by_namespace.setdefault(self.namespace_of(name), []).append(name)
        for namespace, in_it in by_namespace.items():
            self.cp.kubectl("delete", "pod", "-n", namespace, "--wait=false", "--grace-period=0", "--force", *in_it,
                            user="admin")


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in ("Z", "X")


def resolve_env(pod: dict[str, Any], container: str) -> dict[str, str]:
    """The env the kubelet would give the container: literal values and downward-API annotation/label refs."""
    meta = pod["metadata"]
    env: dict[str, str] = {"PATH": "/usr/local/bin:/usr/bin"}
    for c in pod["spec"]["containers"]:
        if c["name"] != container:
            continue
        for var in c.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
                continue
            path = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
            for field, source in (("annotations", meta.get("annotations", {})), ("labels", meta.get("labels", {}))):
                prefix = f"metadata.{field}['"
                if path.startswith(prefix) and path.endswith("']"):
                    key = path[len(prefix):-2]
                    if key in source:
                        env[var["name"]] = source[key]
    return env


def metric_value(text: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None
