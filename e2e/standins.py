"""Stand-ins for the controllers and kubelets an API-only control plane lacks, so that operator commands
(`helm install` waiting on its hook Jobs, `kubectl rollout status`) finish against it as on a cluster:

- a Job whose container runs `gpufrac …` is run here, as that command with the admin kubeconfig (the real
  certificate rotation writes the real Secret and caBundle), and then marked Complete, or Failed if it failed;
- every namespace gets its `default` ServiceAccount, as from the service-account controller;
- Deployments and DaemonSets get the status their controllers would write once every pod is ready;
- with `webhook_ip` (a non-loopback address the harness added, see `harness_address`), the chart's
  webhook Deployment runs here as one `gpufrac webhook` process with its container's arguments and the files of
  its certificate Secret, behind an EndpointSlice of its Service: a kube-apiserver started with
  --enable-aggregator-routing=true then calls it through the Service, TLS name and caBundle exactly as the chart
  configures them. `webhook_down()` takes it away as a failed rollout would (no ready endpoint, 0 available).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from e2e.cluster import ControlPlane
from e2e.names import REPO_ROOT
from e2e.toolkit.procs import free_port

WEBHOOK_COMPONENT = "webhook"


# The webhook stand-in listens on an address the harness adds itself (on a veth pair of its own, removed afterwards:
# this kernel has no dummy links), never on
# one of the machine's own interfaces: EndpointSlices refuse loopback, and traffic stays on this host.
HARNESS_LINK = "gfe-standin0"
HARNESS_ADDRESS = "10.251.0.1"


@contextlib.contextmanager
def harness_address() -> Iterator[str | None]:
    """A non-loopback IPv4 address on a link of the harness's own for the time of the block, or None where links
    cannot be made (not root, no `ip`)."""
    subprocess.run(["ip", "link", "del", HARNESS_LINK], capture_output=True)  # one left by a killed run
    try:
        for cmd in (["ip", "link", "add", HARNESS_LINK, "type", "veth", "peer", "name", HARNESS_LINK + "p"],
                    ["ip", "addr", "add", f"{HARNESS_ADDRESS}/32", "dev", HARNESS_LINK],
                    ["ip", "link", "set", HARNESS_LINK, "up"]):
            subprocess.run(cmd, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        subprocess.run(["ip", "link", "del", HARNESS_LINK], capture_output=True)
        yield None
        return
    try:
        yield HARNESS_ADDRESS
    finally:
        subprocess.run(["ip", "link", "del", HARNESS_LINK], capture_output=True)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StandInControllers:
    def __init__(self, cp: ControlPlane, workdir: Path, *, webhook_ip: str | None = None,
                 interval: float = 0.5) -> None:
        self.cp = cp
        self.workdir = workdir
        self.log = workdir / "stand-ins.log"
        self.webhook_ip = webhook_ip
        self.interval = interval
        self.ran: list[str] = []  # "<namespace>/<job>: <exit code>"
        self.webhook: subprocess.Popen[bytes] | None = None
        self._webhook_wanted = True
        self._lock = threading.Lock()
        self._done: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stand-in-controllers", daemon=True)

    def __enter__(self) -> StandInControllers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._stop_webhook()

    # ---- the webhook "pod" ----

    def webhook_down(self) -> None:
        """Every webhook pod gone: the process stops, its endpoint is not ready, the Deployment has 0 available."""
        with self._lock:
            self._webhook_wanted = False
            self._stop_webhook()
        for deployment in self._webhook_deployments():
            self._mark_deployment(deployment, available=0)
            self._endpoint_slice(deployment, None)

    def webhook_up(self) -> None:
        with self._lock:
            self._webhook_wanted = True  # the next pass starts it and makes the Deployment available

    def _webhook_deployments(self) -> list[dict]:
        return [d for d in self._get("deployments") if self._is_webhook(d)]

    @staticmethod
    def _is_webhook(deployment: dict) -> bool:
        labels = deployment["spec"]["template"]["metadata"].get("labels", {})
        return labels.get("app.kubernetes.io/component") == WEBHOOK_COMPONENT

    def _stop_webhook(self) -> None:
        if self.webhook is not None and self.webhook.poll() is None:
            os.killpg(self.webhook.pid, signal.SIGTERM)
            try:
                self.webhook.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.webhook.pid, signal.SIGKILL)
                self.webhook.wait()
        self.webhook = None

    def _run_webhook(self, deployment: dict) -> int | None:
        """Start the Deployment's container here; the port it serves on, or None (no Secret yet, not wanted)."""
        with self._lock:
            if not self._webhook_wanted or self.webhook_ip is None:
                return None
            if self.webhook is not None and self.webhook.poll() is None:
                return self._webhook_port
            namespace = deployment["metadata"]["namespace"]
            pod = deployment["spec"]["template"]["spec"]
            (secret_volume,) = [v["secret"] for v in pod["volumes"] if "secret" in v]
            result = self.cp.kubectl("get", "secret", secret_volume["secretName"], "-n", namespace, "-o", "json",
                                     user="admin")
            if result.rc != 0:
                return None
            data = json.loads(result.stdout).get("data", {})
            certs = self.workdir / "webhook-certs"
            certs.mkdir(parents=True, exist_ok=True)
            for item in secret_volume.get("items", [{"key": k, "path": k} for k in data]):
                (certs / item["path"]).write_bytes(base64.b64decode(data.get(item["key"], "")))
            (container,) = pod["containers"]
            port = free_port()
            args = _replace_flags(container["args"], {"--certs": str(certs), "--bind": f"{self.webhook_ip}:{port}",
                                                      "--metrics-bind": f"127.0.0.1:{free_port()}"})
            with open(self.workdir / "webhook.log", "ab") as out:
                self.webhook = subprocess.Popen([sys.executable, "-m", "gpufrac", *args], cwd=REPO_ROOT,
                                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self._webhook_port = port
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex((self.webhook_ip, port)) == 0:
                    return port
            time.sleep(0.1)
        return None

    def _endpoint_slice(self, deployment: dict, port: int | None) -> None:
        meta = deployment["metadata"]
        service = meta["name"]  # the chart names the Service after the Deployment
        slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                  "metadata": {"name": f"{service}-stand-in", "namespace": meta["namespace"],
                               "labels": {"kubernetes.io/service-name": service}},
                  "addressType": "IPv4",
                  "ports": [{"name": "https", "port": port or 1, "protocol": "TCP"}],
                  "endpoints": [{"addresses": [self.webhook_ip or "192.0.2.1"],
                                 "conditions": {"ready": port is not None}}]}
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(slice_), user="admin")

    def _stop_webhook_locked(self) -> None:
        with self._lock:
            self._stop_webhook()

    def _get(self, kinds: str) -> list[dict]:
        result = self.cp.kubectl("get", kinds, "-A", "-o", "json", user="admin")
        return json.loads(result.stdout)["items"] if result.rc == 0 else []

    def _status(self, obj: dict, status: dict) -> None:
        meta = obj["metadata"]
        self.cp.kubectl("patch", obj["kind"].lower(), meta["name"], "-n", meta["namespace"], "--subresource=status",
                        "--type=merge", "-p", json.dumps({"status": status}), user="admin")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._default_service_accounts()
            for job in self._get("jobs"):
                self._run_job(job)
            for workload in self._get("deployments,daemonsets"):
                self._make_ready(workload)

    def _default_service_accounts(self) -> None:
        have = {sa["metadata"]["namespace"] for sa in self._get("serviceaccounts")
                if sa["metadata"]["name"] == "default"}
        for ns in self._get("namespaces"):
            name = ns["metadata"]["name"]
            if name not in have and not ns["metadata"].get("deletionTimestamp"):
                self.cp.kubectl("create", "serviceaccount", "default", "-n", name, user="admin")

    def _run_job(self, job: dict) -> None:
        uid = job["metadata"]["uid"]
        if uid in self._done or job.get("status", {}).get("conditions"):
            return
        self._done.add(uid)
        (container,) = job["spec"]["template"]["spec"]["containers"]
        started = _now()
        if container.get("command") == ["gpufrac"]:
            env = {**os.environ, "KUBECONFIG": str(self.cp.kubeconfigs["admin"])}
            with open(self.log, "ab") as out:
                code = subprocess.run([sys.executable, "-m", "gpufrac", *container.get("args", [])], cwd=REPO_ROOT,
                                      env=env, stdout=out, stderr=subprocess.STDOUT, timeout=120).returncode
        else:
            code = 1  # not ours: nothing here can run it
        self.ran.append(f"{job['metadata']['namespace']}/{job['metadata']['name']}: {code}")
        if code == 0:
            conditions = [{"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": _now()},
                          {"type": "Complete", "status": "True", "lastTransitionTime": _now()}]
            self._status(job, {"startTime": started, "completionTime": _now(), "succeeded": 1,
                               "conditions": conditions})
        else:
            conditions = [{"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                           "lastTransitionTime": _now()},
                          {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                           "lastTransitionTime": _now()}]
            self._status(job, {"startTime": started, "failed": 1, "conditions": conditions})

    def _mark_deployment(self, deployment: dict, available: int) -> None:
        n = deployment["spec"].get("replicas", 1)
        ok = "True" if available else "False"
        self._status(deployment, {"observedGeneration": deployment["metadata"].get("generation", 1), "replicas": n,
                                  "updatedReplicas": n, "readyReplicas": available, "availableReplicas": available,
                                  "unavailableReplicas": n - available, "conditions": [
                                      {"type": "Available", "status": ok, "reason": "StandIn"},
                                      {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]})

    def _make_ready(self, workload: dict) -> None:
        generation = workload["metadata"].get("generation", 1)
        status = workload.get("status", {})
        if workload["kind"] == "Deployment":
            if self._is_webhook(workload) and self.webhook_ip is not None:
                with self._lock:
                    wanted = self._webhook_wanted
                    running = self.webhook is not None and self.webhook.poll() is None
                if not wanted or (running and status.get("observedGeneration") == generation
                                  and status.get("availableReplicas")):
                    return
                if status.get("observedGeneration") != generation:
                    self._stop_webhook_locked()  # a new template: a new "pod"
                port = self._run_webhook(workload)
                if port is None:
                    return  # its Secret is not there yet: the pods would wait too
                self._endpoint_slice(workload, port)
                self._mark_deployment(workload, available=workload["spec"].get("replicas", 1))
                return
            if status.get("observedGeneration") == generation:
                return
            self._mark_deployment(workload, available=workload["spec"].get("replicas", 1))
        else:
            if status.get("observedGeneration") == generation:
                return  # a DaemonSet: one node
            self._status(workload, {"observedGeneration": generation, "desiredNumberScheduled": 1,
                                    "currentNumberScheduled": 1, "updatedNumberScheduled": 1, "numberReady": 1,
                                    "numberAvailable": 1, "numberMisscheduled": 0})


def _replace_flags(args: list[str], values: dict[str, str]) -> list[str]:
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg in values:
            out[i + 1] = values[arg]
    return out
