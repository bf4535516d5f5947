"""A real one-node Kubernetes: the control plane of e2e.cluster plus containerd 2 (NRI and CDI on) and runc, the
kubelet, kube-controller-manager, kube-scheduler and kube-proxy (built from the module proxy), the CNI bridge
(a Debian package), fake GPUs (device nodes with NVIDIA's numbers, e2e.toolkit.gpu_devices; the fake NVML and a
fake driver root, testkit.fakes), and NVIDIA's components beside them (built by e2e/build-nvidia.sh): the CDI spec
`nvidia-ctk cdi generate` writes, containerd's `nvidia` runtime handler configured by `nvidia-ctk runtime
configure` with a RuntimeClass `nvidia` (e2e.toolkit.nvidia_toolkit), and NVIDIA's device plugin registering
`nvidia.com/gpu` (e2e.toolkit.nvidia_device_plugin).

Pods run. The node's network lives in a namespace of its own (e2e.toolkit.netns); the apiserver listens on the
host side of its veth, so pods reach it through the `kubernetes` Service (kube-proxy) and it reaches webhook
pods through their endpoints (--enable-aggregator-routing). Images are imported into containerd from the OCI
archives `make image` writes, never pulled.

One real node per machine: the cluster holds `flock /tmp/gpufrac-real-node.lock` for its lifetime (a
`flock -F ... sleep` process it starts first and stops last). `stop()` and `python -m e2e down` put the machine
back: every container process and shim (and its socket), mount, cgroup, the network namespace, the fake device
nodes, and the sysctls the kubelet changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from e2e import credentials, machine
from e2e.cluster import ControlPlane
from e2e.names import NODE_NAME, NODE_ROOT, REPO_ROOT
from e2e.state import REAL_NODE
from e2e.toolkit import (
    apiserver,
    controllers,
    debian,
    gpu_devices,
    kube_proxy,
    nvidia_device_plugin,
    nvidia_toolkit,
    objects,
    pki,
    sysctls,
)
from e2e.toolkit.containerd import Containerd
from e2e.toolkit.errors import ClusterError
from e2e.toolkit.netns import NodeNetwork
from e2e.toolkit.nvidia_toolkit import NvidiaToolkit
from e2e.toolkit.procs import Proc, free_port
from e2e.toolkit.server import wait_ready
from e2e.toolkit.tools import node_binaries
from e2e.toolkit.wait import WaitTimeoutError, wait_until

IMAGES_DIR = REPO_ROOT / ".e2e" / "images"
IMAGE = "localhost/gpufrac:dev"
PAUSE_IMAGE = "localhost/gpufrac-e2e/pause:catatonit"
APP_IMAGE = "nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04"
ARCHIVES = ("pause.oci.tar", "app.oci.tar", "gpufrac.oci.tar")
# NVIDIA's device plugin image (e2e/build-image.sh): imported only by the tests that run the plugin as NVIDIA's pod.
DEVICE_PLUGIN_ARCHIVE = "nvidia-device-plugin.oci.tar"
# Machine-wide paths the kubelet and containerd use whatever they are told; removed on the way out when the
# node created them.
MACHINE_PATHS = ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/run/containerd",
                 "/var/lib/cni", "/run/gpufrac", "/var/log/gpufrac", str(nvidia_device_plugin.HOST_CDI_DIR),
                 nvidia_device_plugin.MPS_ROOT_PARENT)
GPU_UUIDS = tuple(f"GPU-10ca{i}{i}{i}{i}-0000-0000-0000-00000000000{i}" for i in range(4))
DEVICE_PLUGIN = "nvidia-device-plugin"
# NVIDIA's device plugin's device list strategy by default: a CDI one, as the GPU Operator runs it since 25.10
# (its spec names the GPUs as k8s.device-plugin.nvidia.com/gpu=<uuid>, the kind KAI's binder writes on CDI clusters).
DEFAULT_STRATEGY = "cdi-cri"
NODE_COMPONENTS = ("etcd", "kube-apiserver", "containerd", "kubelet", "kube-controller-manager",
                   "kube-scheduler", "kube-proxy", DEVICE_PLUGIN)
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
    return [name for name in (*ARCHIVES, DEVICE_PLUGIN_ARCHIVE) if not (images_dir / name).is_file()]


class RealCluster(ControlPlane):
    """etcd + kube-apiserver + one real node; gpufrac is installed on it with helm (see e2e.install)."""

    kind = REAL_NODE
    title = "real node"
    components = NODE_COMPONENTS

    def __init__(self, workdir: Path | str, *, images_dir: Path = IMAGES_DIR, nri: bool = True,
                 nri_required_plugins: tuple[str, ...] = (), nri_tolerate_annotation: str = "",
                 device_list_strategy: str | None = DEFAULT_STRATEGY, toolkit_hardened: bool = False,
                 **kw) -> None:
        """`nri=False`: containerd with its NRI plugin disabled (a runtime without NRI, as containerd 1.x).
        `nri_required_plugins`: containers are refused while one of these NRI plugins is not connected, except in
        pods annotated `<nri_tolerate_annotation>: "true"` (NRI's default validator).
        `device_list_strategy`: NVIDIA's device plugin's (envvar, cdi-cri, cdi-annotations; None: no device
        plugin). `toolkit_hardened`: the toolkit's config.toml does not accept NVIDIA_VISIBLE_DEVICES from
        unprivileged containers."""
        kw.setdefault("register_webhook", False)
        super().__init__(workdir, **kw)
        self.network = NodeNetwork()
        self.apiserver_host = self.network.host_ip
        self.images_dir = images_dir
        self.node_root = NODE_ROOT
        self.containerd = Containerd(NODE_ROOT / "containerd", PAUSE_IMAGE, self.network, nri=nri,
                                     nri_required_plugins=nri_required_plugins,
                                     nri_tolerate_annotation=nri_tolerate_annotation)
        self.saved_sysctls: dict[str, str] = {}
        self.created_paths: list[str] = []
        self.lock: Proc | None = None
        self.binaries: dict[str, str] = {}
        self.device_list_strategy = device_list_strategy
        self.toolkit_hardened = toolkit_hardened
        self.toolkit: NvidiaToolkit | None = None

    @property
    def nri_socket(self) -> Path:
        """containerd's NRI socket (chart value nri.socketPath); nothing listens there with nri=False."""
        return self.containerd.nri_socket

    @property
    def cdi_dir(self) -> Path:
        """The directory containerd reads CDI specs from (the harness's specs of the fake GPUs are there)."""
        return self.containerd.cdi_dir

    # ---- kubeconfigs ---------------------------------------------------------------------------------------

    @property
    def kubeconfigs(self) -> dict[str, Path]:
        return {**super().kubeconfigs, **{c: self.workdir / f"{c}.kubeconfig" for c in COMPONENT_USERS}}

    def _make_credentials(self) -> None:
        ca, self.tokens = credentials.make_credentials(self.pki, {**credentials.USERS, **COMPONENT_USERS},
                                                       ip_sans=[self.network.host_ip, "10.96.0.1"])
        pki.write_client_cert(ca, self.pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                              ["system:masters"])

    def _apiserver_config(self) -> apiserver.ApiserverConfig:
        cfg = super()._apiserver_config()
        return apiserver.ApiserverConfig(cfg.binary, cfg.etcd_url, cfg.pki, self.network.host_ip, cfg.port,
                                         real_node=True)

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def _check_prerequisites(self) -> None:
        missing = images_missing(self.images_dir)
        if missing:
            raise ImagesMissingError(f"missing images {', '.join(missing)} in {self.images_dir}: run `make image`")
        self.binaries = node_binaries()
        nvidia_toolkit.nvidia_binaries((*nvidia_toolkit.TOOLKIT_BINARIES, DEVICE_PLUGIN))
        debian.ensure_packages(debian.NODE_PACKAGES, say=self._say)

    def _claim_machine(self) -> None:
        self._take_lock()

    def _start_components(self, t0: float) -> None:
        # A crashed run's leftovers.
        machine.clean_machine(self.workdir, {"node_root": str(self.node_root)}, quiet=True)
        self.created_paths = [p for p in MACHINE_PATHS if not os.path.lexists(p)]
        self.saved_sysctls = sysctls.record()
        self.network.create()
        self._make_credentials()
        self.ports = {"etcd": free_port(), "etcd-peer": free_port(), "apiserver": free_port(self.network.host_ip)}
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
        self._start_kubelet(self.binaries["kubelet"])
        self.timings["node_ready_s"] = round(time.monotonic() - t0, 2)
        self._spawn("kube-controller-manager", controllers.controller_manager_argv(
            self.binaries["kube-controller-manager"], self.kubeconfigs["controller-manager"], self.pki,
            self.network.pod_cidr))
        self._spawn("kube-scheduler", controllers.scheduler_argv(self.binaries["kube-scheduler"],
                                                                 self.kubeconfigs["scheduler"]))
        proxy_config = self.workdir / "kube-proxy-config.json"
        kube_proxy.write_config(proxy_config, self.kubeconfigs["proxy"], self.network, NODE_NAME)
        self._spawn("kube-proxy", kube_proxy.argv(self.binaries["kube-proxy"], proxy_config, self.network))
        self._wait_controllers()
        self.apply_objects([nvidia_toolkit.runtime_class()])
        if self.device_list_strategy:
            self.start_device_plugin(self.device_list_strategy)
        self.timings["device_plugin_ready_s"] = round(time.monotonic() - t0, 2)

    @property
    def gpu_fakes(self) -> Path:
        """The host directory values-local.yaml mounts into the agent as /opt/gpu-fakes."""
        return self.node_root / "gpu-fakes"

    @property
    def driver_root(self) -> Path:
        """The fake driver root NVIDIA's components read (the files a 615 driver installs, the fake NVML)."""
        return self.gpu_fakes / "driver-root"

    @property
    def nvml_env(self) -> dict[str, str]:
        """What every NVIDIA process on the node needs to find the fake NVML's state."""
        return {"GPUFRAC_FAKE_NVML": str(self.gpu_fakes / "nvml.json")}

    @property
    def cdi_spec(self) -> Path:
        """The node's CDI spec, as `nvidia-ctk cdi generate` wrote it."""
        return self.cdi_dir / nvidia_toolkit.SPEC_FILE

    def install_gpu_fakes(self) -> None:
        """The node's "driver": the fake libnvidia-ml.so.1 (built from testkit/fakes/fake_nvml.c), its state
        file with four H200s, the fake nvidia-cuda-mps-control, a fake driver root, device nodes /dev/nvidia0..3
        (+ the control devices); then NVIDIA's toolkit: the CDI spec `nvidia-ctk cdi generate` writes against
        them (in containerd's cdi_spec_dirs) and the toolkit's config.toml."""
        from testkit.fakes import driver_root
        from testkit.fakes.build import MPS_CONTROL, fake_nvml_library
        from testkit.fakes.state import FakeGpuState

        (self.gpu_fakes / "lib").mkdir(parents=True, exist_ok=True)
        (self.gpu_fakes / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(fake_nvml_library(), self.gpu_fakes / "lib" / "libnvidia-ml.so.1")
        shutil.copy2(MPS_CONTROL, self.gpu_fakes / "bin" / "nvidia-cuda-mps-control")
        state = FakeGpuState(self.gpu_fakes / "nvml.json")
        for uuid in GPU_UUIDS:
            state.gpu(uuid)
        os.chmod(self.gpu_fakes / "nvml.json", 0o644)
        gpu_devices.create(len(GPU_UUIDS))
        t0 = time.monotonic()
        # With its own dev/ (the same numbers as /dev's), as the GPU Operator's driver root /run/nvidia/driver has:
        # nvidia-container-runtime's jit-cdi mode looks for device nodes under the driver root.
        driver_root.build(self.driver_root, self.gpu_fakes / "nvml.json")
        self.toolkit = NvidiaToolkit(self.node_root / "nvidia-toolkit", self.driver_root, self.nvml_env)
        skip = nvidia_toolkit.hooks_this_host_cannot_run()
        self.toolkit.generate_cdi_spec(self.cdi_spec, *(f"--disable-hook={hook}" for hook in skip))
        self.toolkit.write_config([self.cdi_dir], self.binaries["runc"], hardened=self.toolkit_hardened,
                                  disabled_hooks=skip)
        self.timings["nvidia_toolkit_s"] = round(time.monotonic() - t0, 2)

    def gpu_state(self):
        """The fake NVML's state, for a test to put processes on the GPUs."""
        from testkit.fakes.state import FakeGpuState

        state = FakeGpuState(self.gpu_fakes / "nvml.json")
        for uuid in GPU_UUIDS:
            state.gpu(uuid)
        return state

    def _take_lock(self) -> None:
        self.lock = machine.take_lock(self.workdir, self.detach)

    def _start_containerd(self) -> None:
        assert self.toolkit is not None
        self.containerd.write_config()
        self.toolkit.configure_containerd(self.containerd.config_file)
        # Its shims, and the nvidia-container-runtime they start, inherit containerd's env.
        env = {**self.containerd.env(), **self.nvml_env,
               nvidia_toolkit.CONFIG_ENV: str(self.toolkit.config_file)}
        self._spawn("containerd", self.containerd.argv(), env=env)
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

    # ---- NVIDIA's device plugin -------------------------------------------------------------------------------

    def start_device_plugin(self, strategy: str, *, disable_healthchecks: bool = False,
                            timeout: float = 90) -> None:
        """(Re)start NVIDIA's device plugin with device list `strategy`, and wait until it registered with the
        kubelet and the node's allocatable has its GPUs."""
        self.stop_device_plugin()
        # Its spec directory's mount point (in MACHINE_PATHS: removed on the way out when the node made it).
        nvidia_device_plugin.HOST_CDI_DIR.mkdir(parents=True, exist_ok=True)
        env = nvidia_device_plugin.env(self.nvml_env, os.environ, self.driver_root,
                                       disable_healthchecks=disable_healthchecks)
        log = self.log(DEVICE_PLUGIN)
        offset = log.stat().st_size if log.exists() else 0
        self._spawn(DEVICE_PLUGIN, nvidia_device_plugin.argv(strategy, self.driver_root, self.cdi_dir), env=env)
        self.device_list_strategy = strategy

        def ready() -> bool:
            with log.open("rb") as f:
                f.seek(offset)
                registered = b"Registered device plugin for 'nvidia.com/gpu' with Kubelet" in f.read()
            return registered and self.allocatable().get(nvidia_device_plugin.RESOURCE) == str(len(GPU_UUIDS))

        wait_ready(self.procs[DEVICE_PLUGIN], ready, timeout, interval=0.5)

    def import_device_plugin_image(self) -> str:
        """NVIDIA's device plugin image in containerd (imported once: most tests run the plugin on the host)."""
        if not any(nvidia_device_plugin.IMAGE in line for line in self.containerd.images()):
            self.containerd.import_image(self.images_dir / DEVICE_PLUGIN_ARCHIVE)
        return nvidia_device_plugin.IMAGE

    def stop_device_plugin(self) -> None:
        proc = self.procs.pop(DEVICE_PLUGIN, None)
        if proc is not None:
            proc.stop()
            self._save_state()
        self.device_list_strategy = None

    def allocatable(self) -> dict[str, str]:
        res = self.kubectl("get", "node", NODE_NAME, "-o", "jsonpath={.status.allocatable}", user="admin",
                           timeout=10)
        return json.loads(res.stdout) if res.rc == 0 and res.stdout.strip() else {}

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
        machine.clean_machine(self.workdir, self._extra_state())
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
            f"  runtime: containerd 2, NRI socket {self.nri_socket}"
            + ("" if self.containerd.nri else " (NRI disabled)") + f", CDI specs in {self.cdi_dir}",
            f"  NVIDIA: runtime handler/RuntimeClass `{nvidia_toolkit.RUNTIME_HANDLER}` (toolkit config "
            f"{self.node_root / 'nvidia-toolkit' / 'config.toml'}), device plugin "
            f"({self.device_list_strategy or 'not running'}) registering nvidia.com/gpu",
            f"  logs: {os.path.relpath(self.workdir)}/*.log",
            "  stop: make cluster-down   (or: python -m e2e down)",
        ])
