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
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from e2e.toolkit import apiserver, etcd, pki
from e2e.toolkit.errors import ClusterError, ToolsMissingError
from e2e.toolkit.procs import Proc, free_port, proc_start_time, spawn, tail
from e2e.toolkit.server import wait_ready
from e2e.toolkit.tools import Tools
from e2e.toolkit.wait import WaitTimeoutError, wait_until
from e2e.toolkit.web import https_get
from gpufrac.core.contract import DEFAULT_SCHEDULER_USER, FRACTIONAL_LABEL

__all__ = ["ClusterError", "ControlPlane", "Tools", "ToolsMissingError"]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORKDIR = REPO_ROOT / ".e2e"
CHART_DIR = REPO_ROOT / "charts" / "gpufrac"
WEBHOOK_TEMPLATES = (
    "templates/webhook/mutatingwebhookconfiguration.yaml",
    "templates/webhook/validatingwebhookconfiguration.yaml",
)

USER_NAMESPACE = "team-a"
RELEASE_NAMESPACE = "gpufrac-system"
NODE_NAME = "gpu-node-1"
SCHEDULER_USER = DEFAULT_SCHEDULER_USER  # the identity the webhook trusts by default
RS_CONTROLLER_USER = "system:serviceaccount:kube-system:replicaset-controller"

# Order matters: started in this order, stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "webhook")


# ------------------------------------------------------------------------------------------------------------
# the control plane


@dataclass
class KubectlResult:
    rc: int
    stdout: str
    stderr: str

    def __iter__(self):  # (rc, stdout, stderr) = cp.kubectl(...)
        return iter((self.rc, self.stdout, self.stderr))

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class ControlPlane:
    """etcd + kube-apiserver + the gpufrac webhook, on loopback, in `workdir`.

    `detach=True` leaves everything running when this Python process exits (``python -m e2e up``); stop it
    with ``ControlPlane.stop_recorded(workdir)`` / ``python -m e2e down``.
    """

    kind = "api-only"
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
    ):
        self.workdir = Path(workdir).resolve()
        self.detach = detach
        self.tools = tools
        self.register_webhook = register_webhook
        self.quiet = quiet
        # Extra kube-apiserver flags, e.g. --enable-aggregator-routing=true for webhooks behind a Service
        # (tests/e2e/test_docs.py).
        self.apiserver_flags = tuple(apiserver_flags)
        self.procs: dict[str, Proc] = {}
        self.ports: dict[str, int] = {}
        self.tokens: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.server_version = ""
        self._cleanup_registered = False

    # ---- paths ---------------------------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

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

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        if self.tools is None:
            self.tools = Tools.find()
        t0 = time.monotonic()
        # Whatever a previous run in this workdir left behind goes first (it would hold the data dir and
        # logs).
        self.stop_recorded(self.workdir)
        self._clean_workdir()
        self._register_cleanup()
        try:
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
        except BaseException:
            self.stop()
            raise
        self.timings["cold_start_s"] = round(time.monotonic() - t0, 2)
        self._save_state()
        self._say(f"control plane ready in {self.timings['cold_start_s']} s")
        return self

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
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        if remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @classmethod
    def stop_recorded(cls, workdir: Path | str = DEFAULT_WORKDIR) -> list[str]:
        """Stop what `workdir/state.json` records (from any process). Returns the names of the components that
        were still running."""
        state_file = Path(workdir) / "state.json"
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            return []
        stopped = []
        for name in reversed(state.get("components", COMPONENTS)):
            rec = state.get("procs", {}).get(name)
            if not rec:
                continue
            proc = Proc.from_json(name, rec)
            if proc.alive():
                proc.stop()
                stopped.append(name)
        if state.get("kind") == "real-node":
            from e2e.node import clean_orphan

            clean_orphan(Path(workdir), state)
        with contextlib.suppress(FileNotFoundError):
            state_file.unlink()
        return stopped

    def _clean_machine(self) -> None:
        """What a cluster changed outside its processes goes back (the real node's network, mounts, sysctls)."""

    @staticmethod
    def owner(workdir: Path | str) -> tuple[bool, bool] | None:
        """(detach, owner alive) from `workdir/state.json`, or None without one. A non-detached cluster whose
        owner is alive is in use (a test session, a demo) and stops itself."""
        try:
            state = json.loads((Path(workdir) / "state.json").read_text())
        except (OSError, ValueError):
            return None
        pid, start = state.get("owner_pid"), state.get("owner_start_time")
        alive = isinstance(pid, int) and start is not None and proc_start_time(pid) == start
        return bool(state.get("detach")), alive

    @classmethod
    def load(cls, workdir: Path | str = DEFAULT_WORKDIR) -> ControlPlane | None:
        """A ControlPlane view of a running one (started by another process), or None."""
        workdir = Path(workdir).resolve()
        try:
            state = json.loads((workdir / "state.json").read_text())
        except (OSError, ValueError):
            return None
        if state.get("kind") == "real-node" and cls.kind != "real-node":
            from e2e.node import RealCluster

            return RealCluster.load(workdir)
        cp = cls(workdir, detach=True)
        cp.ports = state["ports"]
        cp.tokens = state["tokens"]
        cp.timings = state.get("timings", {})
        cp.server_version = state.get("server_version", "")
        for name, rec in state.get("procs", {}).items():
            cp.procs[name] = Proc.from_json(name, rec)
        with contextlib.suppress(ToolsMissingError):
            cp.tools = Tools.find()
        return cp

    def status(self) -> dict[str, bool]:
        return {name: (name in self.procs and self.procs[name].alive()) for name in self.components}

    def _save_state(self) -> None:
        state = {
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
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.state_file)

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
        from gpufrac.certs.generate import issue_ca

        pki.make_cluster_pki(self.pki)
        # Throwaway loopback credentials, fresh for every cluster.
        self.tokens = {user: pki.new_token() for user in ("alice", "binder", "admin")}
        pki.write_token_file(self.pki / "tokens.csv", [
            (self.tokens["alice"], "alice", "uid-alice", ["system:authenticated"]),
            (self.tokens["binder"], SCHEDULER_USER, "uid-binder",
             ["system:serviceaccounts", "system:serviceaccounts:kai-scheduler", "system:authenticated"]),
            (self.tokens["admin"], "admin", "uid-admin", ["system:masters", "system:authenticated"]),
        ])
        self._webhook_ca = issue_ca("gpufrac-e2e-webhook-ca")

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

    def kubectl(
        self,
        *args: str,
        user: str = "alice",
        input: str | None = None,
        timeout: float = 60,
        check: bool = False,
    ) -> KubectlResult:
        """Run kubectl as `user` (alice | binder | admin) and return (rc, stdout, stderr)."""
        argv = [self.tools.kubectl, f"--kubeconfig={self.kubeconfigs[user]}", *args]
        res = subprocess.run(
            argv,
            cwd=REPO_ROOT,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECTL_INTERACTIVE_DELETE": "false"},
        )
        result = KubectlResult(res.returncode, res.stdout, res.stderr)
        if check and res.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} (as {user}) failed: {res.stderr.strip()}")
        return result

    def apply_objects(self, objects: list[dict], user: str = "admin") -> None:
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        self.kubectl("apply", "-f", "-", user=user, input=doc, check=True)

    def _bootstrap_objects(self) -> None:
        from e2e.toolkit import objects

        self.apply_objects(objects.load(*objects.API_ONLY))

    # ---- webhook -------------------------------------------------------------------------------------------

    def _make_webhook_certs(self) -> None:
        """The webhook's own CA and serving cert (SANs include 127.0.0.1), once; a restart reuses them, so the
        registered caBundle stays valid."""
        if (self.webhook_certs / "tls.crt").exists():
            return
        from gpufrac.certs.generate import issue_serving_cert, write_serving_files

        ca = self._webhook_ca
        serving = issue_serving_cert(ca, [f"gpufrac-webhook.{RELEASE_NAMESPACE}.svc"])
        write_serving_files(self.webhook_certs, ca, serving)

    def start_webhook(self, timeout: float = 60, extra_args: tuple[str, ...] = ()) -> None:
        """Start `python -m gpufrac webhook` on the recorded port and wait for /readyz; extra_args: policy flags
        (e.g. `--delivery hostPath`)."""
        existing = self.procs.get("webhook")
        if existing is not None and existing.alive():
            return
        self._make_webhook_certs()
        metrics_dir = self.workdir / "webhook-prometheus"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        run_dir = self.workdir / "webhook-run"
        run_dir.mkdir(mode=0o700, exist_ok=True)
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            # gunicorn ≥ 23 opens a control socket at $XDG_RUNTIME_DIR/gunicorn.ctl (else ~/.gunicorn/): keep
            # each cluster's webhook on its own, so parallel clusters (tests, demo, cluster-up) do not collide.
            "XDG_RUNTIME_DIR": str(run_dir),
        }
        self._spawn(
            "webhook",
            [
                sys.executable,
                "-m",
                "gpufrac",
                "webhook",
                "--certs",
                str(self.webhook_certs),
                "--bind",
                f"127.0.0.1:{self.ports['webhook']}",
                *extra_args,
            ],
            env=env,
        )

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

    def render_webhook_configurations(self) -> str:
        """The chart's two webhook configurations, pointed at the local webhook by URL."""
        if not (CHART_DIR / "Chart.yaml").exists():
            raise ClusterError(f"chart not found at {CHART_DIR}")
        ca_b64 = base64.b64encode((self.webhook_certs / "ca.crt").read_bytes()).decode()
        argv = [
            self.tools.helm,
            "template",
            "gpufrac",
            str(CHART_DIR),
            "--namespace",
            RELEASE_NAMESPACE,
            "--set",
            f"webhook.clientConfig.url={self.webhook_url}",
            "--set",
            f"webhook.clientConfig.caBundle={ca_b64}",
        ]
        if self.server_version:
            argv += ["--kube-version", self.server_version]
        for tpl in WEBHOOK_TEMPLATES:
            argv += ["--show-only", tpl]
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.workdir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm" / "config"),
            "HELM_DATA_HOME": str(self.workdir / "helm" / "data"),
        }
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        if res.returncode != 0:
            raise ClusterError(f"helm template failed: {res.stderr.strip()}")
        return res.stdout

    def apply_webhook_configurations(self) -> None:
        manifest = self.render_webhook_configurations()
        (self.workdir / "webhook-configurations.yaml").write_text(manifest)
        res = self.kubectl("apply", "-f", "-", user="admin", input=manifest)
        if res.rc != 0:
            raise ClusterError(f"applying the chart's webhook configurations failed: {res.stderr.strip()}")
        self._wait_webhook_active()

    def _wait_webhook_active(self, timeout: float = 30) -> None:
        """The API server loads webhook configurations from an informer: wait until a fractional dry-run pod
        comes back mutated, so the first test does not race the informer."""
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "e2e-webhook-probe",
                "namespace": USER_NAMESPACE,
                "annotations": {"gpu-fraction": "0.5"},
            },
            "spec": {"containers": [{"name": "app", "image": "busybox"}]},
        }
        def mutated() -> bool:
            res = self.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", user="admin",
                               input=json.dumps(probe))
            return res.rc == 0 and FRACTIONAL_LABEL in res.stdout

        try:
            wait_until(mutated, timeout, "the webhook configurations to be active", interval=0.5)
        except WaitTimeoutError as exc:
            raise ClusterError(f"webhook configurations applied but a fractional dry-run pod is not mutated ({exc}); "
                               f"webhook log:\n{tail(self.log('webhook'))}") from exc

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


def private_workdir(kind: str, root: Path = DEFAULT_WORKDIR) -> Path:
    """`<root>/<kind>-<pid>` for a cluster owned by this process (a test session, a demo), so that two of them
    running at once in the same checkout never share (or stop) each other's cluster. Directories of owners that
    are gone are cleaned up first, stopping anything they left running."""
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(f"{kind}-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or proc_start_time(int(pid)) is not None:
            continue
        ControlPlane.stop_recorded(old)
        shutil.rmtree(old, ignore_errors=True)
    return root / f"{kind}-{os.getpid()}"
