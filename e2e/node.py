"""A real one-node Kubernetes: the control plane of e2e.cluster plus containerd, runc and the CNI bridge (Debian
packages), the kubelet, kube-controller-manager, kube-scheduler and kube-proxy (built from the module proxy).

Pods run. The node's network lives in a namespace of its own (e2e.toolkit.netns); the apiserver listens on the
host side of its veth, so pods reach it through the `kubernetes` Service (kube-proxy) and it reaches webhook
pods through their endpoints (--enable-aggregator-routing). Images are imported into containerd from the OCI
archives `make image` writes, never pulled.

One real node per machine: the cluster holds `flock /tmp/gpufrac-real-node.lock` for its lifetime (a
`flock -F ... sleep` process it starts first and stops last). `stop()` and `python -m e2e down` put the machine
back: every container process, mount, cgroup, the network namespace, and the sysctls the kubelet changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from e2e.cluster import NODE_NAME, REPO_ROOT, SCHEDULER_USER, ClusterError, ControlPlane
from e2e.toolkit import apiserver, controllers, debian, kube_proxy, objects, pki, sysctls
from e2e.toolkit.containerd import Containerd
from e2e.toolkit.netns import NodeNetwork
from e2e.toolkit.procs import Proc, free_port, process_stats, spawn
from e2e.toolkit.tools import node_binaries
from e2e.toolkit.wait import WaitTimeoutError, wait_until

LOCK_FILE = "/tmp/gpufrac-real-node.lock"
NODE_ROOT = Path(os.environ.get("GPUFRAC_NODE_ROOT", "/var/lib/gpufrac-node"))
IMAGES_DIR = REPO_ROOT / ".e2e" / "images"
IMAGE = "localhost/gpufrac:dev"
PAUSE_IMAGE = "localhost/gpufrac-e2e/pause:catatonit"
APP_IMAGE = "nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04"
ARCHIVES = ("pause.oci.tar", "app.oci.tar", "gpufrac.oci.tar")
# Machine-wide paths the kubelet and containerd use whatever they are told; removed on the way out when the
# node created them.
MACHINE_PATHS = ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/run/containerd",
                 "/var/lib/cni", "/run/gpufrac", "/var/log/gpufrac")
GPU_UUIDS = tuple(f"GPU-10ca{i}{i}{i}{i}-0000-0000-0000-00000000000{i}" for i in range(4))
NODE_COMPONENTS = ("etcd", "kube-apiserver", "containerd", "kubelet", "kube-controller-manager",
                   "kube-scheduler", "kube-proxy")
# Users of the node's components, in the token file; the bootstrap RBAC of kube-apiserver binds each one.
COMPONENT_USERS = {
    "node": (f"system:node:{NODE_NAME}", ["system:nodes", "system:authenticated"]),
    "controller-manager": ("system:kube-controller-manager", ["system:authenticated"]),
    "scheduler": ("system:kube-scheduler", ["system:authenticated"]),
    "proxy": ("system:kube-proxy", ["system:authenticated"]),
}


class ImagesMissingError(ClusterError):
    """The OCI archives of `make image` are not there."""


def images_missing(images_dir: Path = IMAGES_DIR) -> list[str]:
    return [name for name in ARCHIVES if not (images_dir / name).is_file()]


class RealCluster(ControlPlane):
    """etcd + kube-apiserver + one real node; gpufrac is installed on it with helm (see e2e.install)."""

    kind = "real-node"
    components = NODE_COMPONENTS

    def __init__(self, workdir: Path | str, *, images_dir: Path = IMAGES_DIR, **kw) -> None:
        kw.setdefault("register_webhook", False)
        super().__init__(workdir, **kw)
        self.network = NodeNetwork()
        self.apiserver_host = self.network.host_ip
        self.images_dir = images_dir
        self.node_root = NODE_ROOT
        self.containerd = Containerd(NODE_ROOT / "containerd", PAUSE_IMAGE, self.network)
        self.saved_sysctls: dict[str, str] = {}
        self.created_paths: list[str] = []
        self.lock: Proc | None = None

    # ---- kubeconfigs ---------------------------------------------------------------------------------------

    @property
    def kubeconfigs(self) -> dict[str, Path]:
        return {**super().kubeconfigs, **{c: self.workdir / f"{c}.kubeconfig" for c in COMPONENT_USERS}}

    def _make_credentials(self) -> None:
        from gpufrac.certs.generate import issue_ca

        ca = pki.make_cluster_pki(self.pki, ip_sans=[self.network.host_ip, "10.96.0.1"])
        pki.write_client_cert(ca, self.pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                              ["system:masters"])
        self.tokens = {user: pki.new_token() for user in ("alice", "binder", "admin", *COMPONENT_USERS)}
        rows = [
            (self.tokens["alice"], "alice", "uid-alice", ["system:authenticated"]),
            (self.tokens["binder"], SCHEDULER_USER, "uid-binder",
             ["system:serviceaccounts", "system:serviceaccounts:kai-scheduler", "system:authenticated"]),
            (self.tokens["admin"], "admin", "uid-admin", ["system:masters", "system:authenticated"]),
        ]
        rows += [(self.tokens[c], user, f"uid-{c}", groups) for c, (user, groups) in COMPONENT_USERS.items()]
        pki.write_token_file(self.pki / "tokens.csv", rows)
        self._webhook_ca = issue_ca("gpufrac-e2e-webhook-ca")

    def _apiserver_config(self) -> apiserver.ApiserverConfig:
        cfg = super()._apiserver_config()
        return apiserver.ApiserverConfig(cfg.binary, cfg.etcd_url, cfg.pki, self.network.host_ip, cfg.port,
                                         real_node=True)

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> RealCluster:
        missing = images_missing(self.images_dir)
        if missing:
            raise ImagesMissingError(f"missing images {', '.join(missing)} in {self.images_dir}: run `make image`")
        binaries = node_binaries()
        debian.ensure_packages(debian.NODE_PACKAGES, say=self._say)
        from e2e.cluster import Tools

        if self.tools is None:
            self.tools = Tools.find()
        t0 = time.monotonic()
        self.stop_recorded(self.workdir)
        self._clean_workdir()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        self._register_cleanup()
        try:
            clean_machine(self.workdir, {"node_root": str(self.node_root)}, quiet=True)  # a crashed run's leftovers
            self.created_paths = [p for p in MACHINE_PATHS if not os.path.lexists(p)]
            self.saved_sysctls = sysctls.record()
            self.network.create()
            self._make_credentials()
            self.ports = {"etcd": free_port(), "etcd-peer": free_port(),
                          "apiserver": free_port(self.network.host_ip)}
            self._save_state()
            self._start_etcd()
            self._start_apiserver()
            self.timings["apiserver_ready_s"] = round(time.monotonic() - t0, 2)
            self._write_kubeconfigs()
            for component in COMPONENT_USERS:
                pki.write_kubeconfig(self.kubeconfigs[component], self.server, self.ca_file,
                                     COMPONENT_USERS[component][0], token=self.tokens[component])
            self.apply_objects(objects.load(*objects.COMMON))
            self.install_gpu_fakes()
            self._start_containerd()
            self._start_kubelet(binaries["kubelet"])
            self.timings["node_ready_s"] = round(time.monotonic() - t0, 2)
            self._spawn("kube-controller-manager", controllers.controller_manager_argv(
                binaries["kube-controller-manager"], self.kubeconfigs["controller-manager"], self.pki,
                self.network.pod_cidr))
            self._spawn("kube-scheduler", controllers.scheduler_argv(binaries["kube-scheduler"],
                                                                     self.kubeconfigs["scheduler"]))
            proxy_config = self.workdir / "kube-proxy-config.json"
            kube_proxy.write_config(proxy_config, self.kubeconfigs["proxy"], self.network, NODE_NAME)
            self._spawn("kube-proxy", kube_proxy.argv(binaries["kube-proxy"], proxy_config, self.network))
            self._wait_controllers()
        except BaseException:
            self.stop()
            raise
        self.timings["cold_start_s"] = round(time.monotonic() - t0, 2)
        self._save_state()
        self._say(f"real node ready in {self.timings['cold_start_s']} s")
        return self

    @property
    def gpu_fakes(self) -> Path:
        """The host directory values-local.yaml mounts into the agent as /opt/gpu-fakes."""
        return self.node_root / "gpu-fakes"

    def install_gpu_fakes(self) -> None:
        """The node's "driver": the fake libnvidia-ml.so.1 (built from tests/fakes/fake_nvml.c), its state
        file with two H200s, and the fake nvidia-cuda-mps-control."""
        from tests.fakes.build import MPS_CONTROL, fake_nvml_library
        from tests.fakes.state import FakeGpuState

        (self.gpu_fakes / "lib").mkdir(parents=True, exist_ok=True)
        (self.gpu_fakes / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(fake_nvml_library(), self.gpu_fakes / "lib" / "libnvidia-ml.so.1")
        shutil.copy2(MPS_CONTROL, self.gpu_fakes / "bin" / "nvidia-cuda-mps-control")
        state = FakeGpuState(self.gpu_fakes / "nvml.json")
        for uuid in GPU_UUIDS:
            state.gpu(uuid)
        os.chmod(self.gpu_fakes / "nvml.json", 0o644)

    def gpu_state(self):
        """The fake NVML's state, for a test to put processes on the GPUs."""
        from tests.fakes.state import FakeGpuState

        state = FakeGpuState(self.gpu_fakes / "nvml.json")
        for uuid in GPU_UUIDS:
            state.gpu(uuid)
        return state

    def _take_lock(self) -> None:
        """The machine's one real node: this process takes the flock (waiting up to $GPUFRAC_NODE_LOCK_WAIT
        seconds for another node to go), then hands it to a `sleep infinity` child that holds it as long as
        the node lives (a flock belongs to the open file, which the child inherits)."""
        fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            wait = float(os.environ.get("GPUFRAC_NODE_LOCK_WAIT", "0"))
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise ClusterError(
                            f"another real node holds {LOCK_FILE} (pids {lock_holders()}): one "
                            "real node per machine; stop it with `make cluster-down`, or set "
                            "GPUFRAC_NODE_LOCK_WAIT=<seconds> to wait for it") from None
                    time.sleep(1)
            self.lock = spawn("node-lock", ["sleep", "infinity"], self.workdir / "node-lock.log", pass_fds=(fd,),
                              die_with_parent_signal=None if self.detach else signal.SIGKILL)
        finally:
            os.close(fd)

    def _start_containerd(self) -> None:
        self.containerd.write_config()
        self._spawn("containerd", self.containerd.argv())
        self._wait_ready("containerd", self.containerd.ready, timeout=60)
        for name in ARCHIVES:
            self.containerd.import_image(self.images_dir / name)
        present = self.containerd.images()
        for ref in (IMAGE, PAUSE_IMAGE, APP_IMAGE):
            if not any(ref in line for line in present):
                raise ClusterError(f"image {ref} not in containerd after import (found {present})")

    def _start_kubelet(self, binary: str) -> None:
        from e2e.toolkit.kubelet import Kubelet

        kubelet = Kubelet(binary, self.node_root, self.network, NODE_NAME, self.containerd.socket,
                          self.kubeconfigs["node"], self.ca_file,
                          {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": NODE_NAME})
        kubelet.prepare()
        self._spawn("kubelet", kubelet.argv())
        self._wait_ready("kubelet", self.node_ready, timeout=120)
        problems = Kubelet.config_problems(self.log("kubelet"))
        if problems:
            raise ClusterError(f"the kubelet ignored parts of its config: {problems[:3]}")

    def node_ready(self) -> bool:
        res = self.kubectl("get", "node", NODE_NAME, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')]"
                           ".status}", user="admin", timeout=10)
        return res.rc == 0 and res.stdout.strip() == "True"

    def _wait_controllers(self) -> None:
        """The controller-manager publishes kube-root-ca.crt (pods mounting a token wait for it) and the
        token controller runs; kube-proxy has programmed the `kubernetes` Service."""
        def ready() -> bool:
            for name in ("kube-controller-manager", "kube-scheduler", "kube-proxy"):
                proc = self.procs[name]
                if not proc.alive():
                    raise ClusterError(f"{name} exited; last lines of {proc.log}:\n{proc.tail()}")
            res = self.kubectl("get", "configmap", "kube-root-ca.crt", "-n", "team-a", user="admin", timeout=10)
            if res.rc != 0:
                return False
            rules = subprocess.run(self.network.enter(["iptables-save", "-t", "nat"]), capture_output=True,
                                   text=True).stdout
            return "default/kubernetes:https" in rules

        try:
            wait_until(ready, 90, "the controller-manager and kube-proxy", interval=0.5)
        except WaitTimeoutError as exc:
            raise ClusterError(f"{exc}; kube-proxy log:\n{self.procs['kube-proxy'].tail()}") from exc

    def _extra_state(self) -> dict:
        return {
            "node_root": str(self.node_root),
            "sysctls": self.saved_sysctls,
            "created_paths": self.created_paths,
            "lock": self.lock.to_json() if self.lock else None,
        }

    def _clean_machine(self) -> None:
        if self.lock is None:  # never got the machine (another node holds it): nothing here is ours
            return
        clean_machine(self.workdir, self._extra_state())
        self.lock = None

    # ---- for people ----------------------------------------------------------------------------------------

    def usage(self) -> str:
        rel = os.path.relpath(self.kubeconfigs["admin"])
        return "\n".join([
            f"gpufrac real node is up ({self.server_version or 'kubernetes'} at {self.server}, node {NODE_NAME} "
            f"at {self.network.node_ip}); state in {os.path.relpath(self.workdir)}",
            f"  as cluster admin:  export KUBECONFIG={rel}",
            "  install gpufrac:   helm install gpufrac charts/gpufrac -n gpufrac-system --create-namespace "
            "-f charts/gpufrac/values-local.yaml",
            f"  logs: {os.path.relpath(self.workdir)}/*.log",
            "  stop: make cluster-down   (or: python -m e2e down)",
        ])


# ---- putting the machine back ----------------------------------------------------------------------------


def _kubepods_cgroups() -> list[Path]:
    """Every kubepods cgroup directory in every v1 hierarchy (and the v2 one), deepest first."""
    found: list[Path] = []
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        for top in (hierarchy / "kubepods", hierarchy / "kubepods.slice"):
            if top.is_dir():
                found += [Path(dirpath) for dirpath, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _kill_cgroup_members(cgroups: list[Path]) -> int:
    killed = 0
    for cg in cgroups:
        with contextlib.suppress(OSError):
            for pid in (cg / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
    return killed


def _kill_shims(node_root: Path) -> None:
    for pid, _ in process_stats():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "containerd-shim" in cmdline and str(node_root) in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _unmount_under(root: Path) -> None:
    prefix = str(root).rstrip("/") + "/"
    for _ in range(5):
        mounts = [line.split()[1].encode().decode("unicode_escape") for line in
                  Path("/proc/mounts").read_text().splitlines()]
        under = [m for m in mounts if m == str(root) or m.startswith(prefix)]
        if not under:
            return
        for mount in sorted(under, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)


def lock_holders() -> str:
    """The pids holding the machine's lock, as fuser lists them ('?' when it cannot tell)."""
    return subprocess.run(["fuser", LOCK_FILE], capture_output=True, text=True).stdout.strip() or "?"


def machine_is_free() -> bool:
    """No real node holds the machine's lock now (a probe from an open file of its own, let go at once)."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def clean_orphan(workdir: Path, state: dict) -> None:
    """What a node whose owner is gone left on the machine goes, but only while the machine is still that
    node's: its lock holder still runs, or nobody holds the lock (taken for the cleanup). Another live node
    holding it means the namespace, cgroups and mounts are that node's now: tearing them down broke it (seen:
    one clone's `e2e down` of its crashed node cut a running node's apiserver off its own address)."""
    lock = state.get("lock")
    if lock and Proc.from_json("node-lock", lock).alive():
        clean_machine(workdir, state)
        return
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[e2e] {workdir}: left the machine's node state alone: another real node holds {LOCK_FILE} "
                  f"(pids {lock_holders()}) and owns it now")
            return
        clean_machine(workdir, state)
    finally:
        os.close(fd)


def clean_machine(workdir: Path, state: dict, quiet: bool = False) -> None:
    """Everything a real node left on the machine goes: container processes and shims, mounts under its root,
    kubepods cgroups, its network namespace, the machine-wide paths it created; the sysctls come back; the
    lock goes last. Safe to run twice, and on a machine where no node ever ran."""
    node_root = Path(state.get("node_root") or NODE_ROOT)
    cgroups = _kubepods_cgroups()
    for _ in range(20):
        if not _kill_cgroup_members(cgroups):
            break
        time.sleep(0.1)
    _kill_shims(node_root)
    _unmount_under(node_root)
    for cg in _kubepods_cgroups():
        with contextlib.suppress(OSError):
            cg.rmdir()
    NodeNetwork().destroy()
    changed = sysctls.restore(state.get("sysctls") or {})
    if changed and not quiet:
        print(f"[e2e] restored sysctls the node had changed: {changed}")
    for path in state.get("created_paths") or ():
        with contextlib.suppress(OSError):
            if os.path.islink(path) or os.path.isfile(path):
                os.unlink(path)
            else:
                shutil.rmtree(path)
    if node_root.exists():
        shutil.rmtree(node_root, ignore_errors=True)
    lock = state.get("lock")
    if lock:
        Proc.from_json("node-lock", lock).stop()
