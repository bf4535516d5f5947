"""A real, local Kubernetes control plane for end-to-end tests and demos.

`ControlPlane` starts etcd and kube-apiserver on free loopback ports, sets up the users, namespaces, RBAC
and the node the tests need, starts the gpufrac webhook (``python -m gpufrac webhook``) and registers it
through the chart's own Mutating/ValidatingWebhookConfiguration (``helm template … --show-only …``), so what
the tests see is what a user of a real cluster sees.

No scheduler, controller-manager or kubelet runs: pods are stored, never run. That is all admission needs.

Process handling: every child runs in its own session (so its own process group), logs to ``<workdir>/*.log``,
and is recorded with its start time in ``<workdir>/state.json``, so ``python -m e2e down`` from another
process can stop exactly these processes (a recycled pid is never signalled). A ControlPlane that is not
``detach``-ed stops everything on ``stop()``, at interpreter exit, on SIGTERM/SIGHUP, and its children get
SIGTERM from the kernel if the Python process dies without cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Self

from e2e import credentials, state, webhook_configurations
from e2e.kubectl import KubectlResult, as_list, run_kubectl
from e2e.names import DEFAULT_WORKDIR, REPO_ROOT, USER_NAMESPACE
from e2e.toolkit import apiserver, etcd, pki, webhook
from e2e.toolkit.errors import ClusterError, ToolsMissingError
from e2e.toolkit.procs import Proc, free_port, proc_start_time, spawn
from e2e.toolkit.server import wait_ready
from e2e.toolkit.tools import Tools
from e2e.toolkit.web import https_get

# Order matters: started in this order, stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "webhook")


class ControlPlane:
    """etcd + kube-apiserver + the gpufrac webhook, on loopback, in `workdir`.

    `detach=True` leaves everything running when this Python process exits (``python -m e2e up``); stop it
    with ``e2e.state.stop_recorded(workdir)`` / ``python -m e2e down``.
    """

    kind = "api-only"
    title = "control plane"
    components: tuple[str, ...] = COMPONENTS
    apiserver_host = "127.0.0.1"

    def __init__(
        self,
        workdir: Path | str = DEFAULT_WORKDIR,
        *,
        detach: bool = False,
        tools: Tools | None = None,
        register_webhook: bool = True,
        quiet: bool = True,
        apiserver_flags: tuple[str, ...] = (),
        policies: bool = True,
    ):
        self.workdir = Path(workdir).resolve()
        self.detach = detach
        self.tools = tools
        self.register_webhook = register_webhook
        self.quiet = quiet
        # Extra kube-apiserver flags, e.g. --enable-aggregator-routing=true for webhooks behind a Service
        # (tests/e2e/test_docs.py).
        self.apiserver_flags = tuple(apiserver_flags)
        # Register the chart's ValidatingAdmissionPolicies beside the webhook configurations (policies.enabled).
        self.policies = policies
        self.procs: dict[str, Proc] = {}
        self.ports: dict[str, int] = {}
        self.tokens: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.server_version = ""
        self._cleanup_registered = False

    # ---- paths ---------------------------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return state.state_file(self.workdir)

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def webhook_certs(self) -> Path:
        return self.workdir / "webhook-certs"

    @property
    def kubeconfigs(self) -> dict[str, Path]:
        return {
            "alice": self.workdir / "kubeconfig",
            "binder": self.workdir / "binder.kubeconfig",
            "admin": self.workdir / "admin.kubeconfig",
        }

    @property
    def server(self) -> str:
        return f"https://{self.apiserver_host}:{self.ports['apiserver']}"

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.ports['webhook']}"

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(f"[e2e] {msg}", file=sys.stderr, flush=True)

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Start every component (whatever a previous run in this workdir left goes first); on any failure,
        stop what started and raise."""
        self._check_prerequisites()
        if self.tools is None:
            self.tools = Tools.find()
        t0 = time.monotonic()
        state.stop_recorded(self.workdir)  # a previous run's processes would hold the data dir and logs
        self._clean_workdir()
        self._claim_machine()
        self._register_cleanup()
        try:
            self._start_components(t0)
        except BaseException:
            self.stop()
            raise
        self.timings["cold_start_s"] = round(time.monotonic() - t0, 2)
        self._save_state()
        self._say(f"{self.title} ready in {self.timings['cold_start_s']} s")
        return self

    def _check_prerequisites(self) -> None:
        """What must be there before anything starts (the API-only cluster needs only the tools)."""

    def _claim_machine(self) -> None:
        """What this cluster holds of the machine while it lives (the API-only cluster: nothing)."""

    def _start_components(self, t0: float) -> None:
        self._make_credentials()
        self.ports = {
            "etcd": free_port(),
            "etcd-peer": free_port(),
            "apiserver": free_port(),
            "webhook": free_port(),
        }
        self._start_etcd()
        self._start_apiserver()
        self.timings["apiserver_ready_s"] = round(time.monotonic() - t0, 2)
        self._write_kubeconfigs()
        self._bootstrap_objects()
        self.start_webhook()
        if self.register_webhook:
            self.apply_webhook_configurations()

    _OWNED = (
        "pki",
        "webhook-certs",
        "etcd-data",
        "helm",
        "webhook-prometheus",
        "webhook-run",
        "state.json",
        "state.tmp",
        "kubeconfig",
        "binder.kubeconfig",
        "admin.kubeconfig",
        "webhook-configurations.yaml",
        *(f"{c}.log" for c in COMPONENTS),
    )

    def _clean_workdir(self) -> None:
        """Remove what a previous run here left, and only that: other clusters (tests, demo) may live in
        subdirectories of the default workdir."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in self._OWNED:
            path = self.workdir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def stop(self, remove_workdir: bool = False) -> None:
        """Stop every component this object started (reverse order) and forget the state file; with
        `remove_workdir`, delete the whole working directory too."""
        for name in reversed(self.components):
            proc = self.procs.pop(name, None)
            if proc is not None:
                proc.stop()
        self._clean_machine()
        state.forget(self.workdir)
        if remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _clean_machine(self) -> None:
        """What a cluster changed outside its processes goes back (the real node's network, mounts, sysctls)."""

    @classmethod
    def load(cls, workdir: Path | str = DEFAULT_WORKDIR) -> ControlPlane | None:
        """A view of a running cluster of this kind (started by another process), or None."""
        workdir = Path(workdir).resolve()
        recorded = state.read(workdir)
        if recorded is None or recorded.get("kind") != cls.kind:
            return None
        cp = cls(workdir, detach=True)
        cp.ports = recorded["ports"]
        cp.tokens = recorded["tokens"]
        cp.timings = recorded.get("timings", {})
        cp.server_version = recorded.get("server_version", "")
        for name, rec in recorded.get("procs", {}).items():
            cp.procs[name] = Proc.from_json(name, rec)
        with contextlib.suppress(ToolsMissingError):
            cp.tools = Tools.find()
        return cp

    def status(self) -> dict[str, bool]:
        return {name: (name in self.procs and self.procs[name].alive()) for name in self.components}

    def _save_state(self) -> None:
        state.write(self.workdir, {
            "kind": self.kind,
            "components": list(self.components),
            **self._extra_state(),
            "owner_pid": os.getpid(),
            "owner_start_time": proc_start_time(os.getpid()),
            "detach": self.detach,
            "ports": self.ports,
            "tokens": self.tokens,
            "timings": self.timings,
            "server_version": self.server_version,
            "procs": {name: p.to_json() for name, p in self.procs.items()},
            "kubeconfigs": {k: str(v) for k, v in self.kubeconfigs.items()},
        })

    def _extra_state(self) -> dict:
        return {}

    def _register_cleanup(self) -> None:
        if self.detach or self._cleanup_registered:
            return
        self._cleanup_registered = True
        atexit.register(self.stop)

        def on_signal(signum: int, _frame: object) -> None:
            self.stop()
            # Let the default action (or a previous handler) run; SystemExit runs other atexit/finally blocks.
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):  # not the main thread: atexit and PDEATHSIG still cover it
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    signal.signal(sig, on_signal)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        # If this process dies without stopping them: etcd and kube-apiserver get SIGKILL (with SIGTERM each
        # waits for the other: etcd drains the apiserver's watch streams, the apiserver its storage, for
        # many seconds), the webhook SIGTERM (gunicorn's master then stops its workers).
        death_signal = signal.SIGTERM if name == "webhook" else signal.SIGKILL
        proc = spawn(name, argv, self.log(name), env=env, cwd=REPO_ROOT,
                     die_with_parent_signal=None if self.detach else death_signal)
        self.procs[name] = proc
        if self.state_file.parent.exists():
            self._save_state()
        return proc

    def _wait_ready(self, name: str, check, timeout: float) -> None:
        wait_ready(self.procs[name], check, timeout)

    # ---- credentials ---------------------------------------------------------------------------------------

    def _make_credentials(self) -> None:
        # Throwaway loopback credentials, fresh for every cluster.
        _, self.tokens = credentials.make_credentials(self.pki, credentials.USERS)

    def _write_kubeconfigs(self) -> None:
        for user, path in self.kubeconfigs.items():
            pki.write_kubeconfig(path, self.server, self.ca_file, user, token=self.tokens[user],
                                 namespace=USER_NAMESPACE)

    # ---- etcd and kube-apiserver ---------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        self._spawn("etcd", etcd.argv(self.tools.etcd, self.workdir / "etcd-data", self.ports["etcd"],
                                      self.ports["etcd-peer"]))
        self._wait_ready("etcd", lambda: etcd.healthy(self.ports["etcd"]), timeout=30)

    def _apiserver_config(self) -> apiserver.ApiserverConfig:
        return apiserver.ApiserverConfig(self.tools.kube_apiserver, etcd.client_url(self.ports["etcd"]), self.pki,
                                         "127.0.0.1", self.ports["apiserver"])

    def _start_apiserver(self) -> None:
        self._spawn("kube-apiserver", [*apiserver.argv(self._apiserver_config()), *self.apiserver_flags])

        def ready() -> bool:
            code, _ = https_get(f"{self.server}/readyz", self.ca_file, self.tokens["admin"])
            return code == 200

        self._wait_ready("kube-apiserver", ready, timeout=120)
        code, body = https_get(f"{self.server}/version", self.ca_file, self.tokens["admin"])
        if code == 200:
            self.server_version = json.loads(body).get("gitVersion", "")

    def stop_apiserver(self, kill: bool = True) -> None:
        """Stop kube-apiserver alone (etcd, its data and the webhook stay): SIGKILL by default, a crash; with
        `kill=False` SIGTERM first. `start_apiserver` brings it back on the same port."""
        proc = self.procs.pop("kube-apiserver", None)
        if proc is not None:
            if kill:
                proc.kill()
            proc.stop()
        self._save_state()

    def start_apiserver(self, timeout: float = 120) -> None:
        """Start kube-apiserver again on the recorded port and etcd, wait for /readyz and for the webhook
        configurations to be active again (the informer reloads them from etcd)."""
        existing = self.procs.get("kube-apiserver")
        if existing is not None and existing.alive():
            return
        self._start_apiserver()
        self._save_state()
        if self.register_webhook:
            self._wait_webhook_active(timeout=timeout)

    # ---- kubectl -------------------------------------------------------------------------------------------

    def kubectl(self, *args: str, user: str = "alice", input: str | None = None, timeout: float = 60,
                check: bool = False) -> KubectlResult:
        """Run kubectl as `user` (alice | binder | admin) and return (rc, stdout, stderr)."""
        return run_kubectl(self.tools.kubectl, self.kubeconfigs[user], *args, user=user, input=input,
                           timeout=timeout, check=check)

    def apply_objects(self, objects: list[dict], user: str = "admin") -> None:
        self.kubectl("apply", "-f", "-", user=user, input=as_list(objects), check=True)

    def _bootstrap_objects(self) -> None:
        from e2e.toolkit import objects

        self.apply_objects(objects.load(*objects.API_ONLY))

    # ---- webhook -------------------------------------------------------------------------------------------

    def start_webhook(self, timeout: float = 60, extra_args: tuple[str, ...] = ()) -> None:
        """Start `python -m gpufrac webhook` on the recorded port and wait for /readyz; extra_args: policy flags
        (e.g. `--delivery hostPath`)."""
        existing = self.procs.get("webhook")
        if existing is not None and existing.alive():
            return
        credentials.write_webhook_certs(self.webhook_certs)
        metrics_dir = self.workdir / "webhook-prometheus"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        self._spawn("webhook", [*webhook.argv(self.webhook_certs, self.ports["webhook"]), *extra_args],
                    env=webhook.env(self.workdir / "webhook-run", metrics_dir))

        def ready() -> bool:
            code, _ = https_get(f"{self.webhook_url}/readyz", self.webhook_certs / "ca.crt")
            return code == 200

        self._wait_ready("webhook", ready, timeout=timeout)
        self._save_state()

    def stop_webhook(self) -> None:
        """Stop the webhook alone; its configurations stay registered (so the API server sees it down)."""
        proc = self.procs.pop("webhook", None)
        if proc is not None:
            proc.stop()
        self._save_state()

    def webhook_metrics(self) -> str:
        code, body = https_get(f"{self.webhook_url}/metrics", self.webhook_certs / "ca.crt")
        if code != 200:
            raise ClusterError(f"GET {self.webhook_url}/metrics -> {code}: {body[:300]}")
        return body

    def render_webhook_configurations(self, *values: str) -> str:
        """The chart's two webhook configurations, pointed at the local webhook by URL, and (with `policies`) its
        ValidatingAdmissionPolicies; `values`: more `--set k=v` pairs."""
        return webhook_configurations.render(
            self.tools.helm, self.workdir / "helm", self.webhook_url, self.webhook_certs / "ca.crt", *values,
            policies=self.policies, kube_version=self.server_version)

    def apply_webhook_configurations(self, *values: str, wait: bool = True,
                                     gate_labels: dict[str, str] | None = None) -> None:
        """Apply what `render_webhook_configurations(*values)` renders; with `wait`, until the API server uses it
        (needs the webhook up). `gate_labels`: the chart's label gate (webhook.podLabelSelector) set to them, and
        the probes that wait carry them."""
        gate = [f"webhook.podLabelSelector.{key.replace('.', chr(92) + '.')}={value}"
                for key, value in (gate_labels or {}).items()]
        manifest = self.render_webhook_configurations(*values, *gate)
        (self.workdir / "webhook-configurations.yaml").write_text(manifest)
        res = self.kubectl("apply", "-f", "-", user="admin", input=manifest)
        if res.rc != 0:
            raise ClusterError(f"applying the chart's webhook configurations failed: {res.stderr.strip()}")
        if wait:
            self._wait_webhook_active(gate_labels=gate_labels)
            if self.policies:
                self.wait_policies_active(gate_labels=gate_labels)

    def _as_admin(self, *args: str, input: str | None = None) -> KubectlResult:
        return self.kubectl(*args, user="admin", input=input)

    def wait_policies_active(self, timeout: float = 30, gate_labels: dict[str, str] | None = None) -> None:
        webhook_configurations.wait_policies_active(self._as_admin, self.log("kube-apiserver"), timeout, gate_labels)

    def _wait_webhook_active(self, timeout: float = 30, gate_labels: dict[str, str] | None = None) -> None:
        webhook_configurations.wait_webhook_active(self._as_admin, self.log("webhook"), timeout, gate_labels)

    # ---- for people ----------------------------------------------------------------------------------------

    def usage(self) -> str:
        kc = self.kubeconfigs
        rel = {k: os.path.relpath(v) for k, v in kc.items()}
        return "\n".join(
            [
                f"gpufrac e2e control plane is up ({self.server_version or 'kube-apiserver'} "
                f"at {self.server}, "
                f"webhook at {self.webhook_url}); state in {os.path.relpath(self.workdir)}",
                f"  as alice (namespace {USER_NAMESPACE}):   export KUBECONFIG={rel['alice']}",
                f"  as the scheduler's binder:        kubectl --kubeconfig {rel['binder']} …",
                f"  as cluster admin:                 kubectl --kubeconfig {rel['admin']} …",
                f"  kubectl: {self.tools.kubectl if self.tools else 'kubectl'}",
                "  try:  kubectl apply -f examples/inference-sm-sharing.yaml",
                "        kubectl get pod inference -o yaml",
                f"  logs: {os.path.relpath(self.workdir)}/{{etcd,kube-apiserver,webhook}}.log",
                "  stop: make cluster-down   (or: python -m e2e down)",
            ]
        )

