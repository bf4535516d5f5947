"""gpufrac on a real node, installed with helm as a user installs it: fractional pods start and see their
limits, the agent attributes their real processes, and the webhook survives a rollout and losing a replica.

The tests run in file order against one cluster and one release (the last one uninstalls it).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from e2e.agent_world import metric_value
from e2e.install import Helm
from e2e.names import KAI_CONDITIONS, NODE_NAME, RELEASE_NAMESPACE, USER_NAMESPACE
from e2e.node import GPU_UUIDS, RealCluster
from e2e.pods import (
    SEED_BINDS,
    SEED_ENV,
    SEED_EXAMPLES,
    agent_metrics,
    bind,
    create,
    exec_in,
    get_json,
    get_pod,
    host_pids,
    plain_pod,
    wait_running,
)
from e2e.testing import example, unique
from e2e.toolkit.wait import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]

MIB = 2**20


# ---- helpers -------------------------------------------------------------------------------------------------


def kubectl_json(node: RealCluster, *args: str) -> dict:
    return get_json(node, *args)


def fractional_pod(name: str) -> dict:
    p = example("notebook-time-slicing.yaml", name)
    p["spec"]["terminationGracePeriodSeconds"] = 1
    return p


def webhook_pods(node: RealCluster) -> list[dict]:
    return kubectl_json(node, "get", "pods", "-n", RELEASE_NAMESPACE, "-l",
                        "app.kubernetes.io/component=webhook")["items"]


# What the release writes on the node but its MPS logs (DRA's /var/lib/gpufrac is off in this install).
HOST_PATHS = ("/run/gpufrac",)


def gpufrac_leftovers(node_obj: dict) -> list[str]:
    """The agent's labels and conditions still on the node (gpufrac.io/ and KAI's readiness)."""
    labels = [k for k in node_obj["metadata"]["labels"] if k.startswith("gpufrac.io/")]
    conditions = [c["type"] for c in node_obj["status"]["conditions"]
                  if c["type"].startswith("gpufrac.io/") or c["type"] in KAI_CONDITIONS]
    return labels + conditions


# ---- install -------------------------------------------------------------------------------------------------


def test_helm_install_brings_up_the_webhook_and_the_agent(node: RealCluster, installed: Helm):
    deploy = kubectl_json(node, "get", "deployment", "gpufrac-webhook", "-n", RELEASE_NAMESPACE)
    assert deploy["status"].get("readyReplicas") == 2
    assert kubectl_json(node, "get", "pdb", "-n", RELEASE_NAMESPACE)["items"], "no PodDisruptionBudget"
    # The chart's rotation job wrote the CA into both configurations (Service mode, no URL).
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cfg = kubectl_json(node, "get", kind, "-l", "app.kubernetes.io/instance=gpufrac")["items"]
        assert cfg, f"no {kind}"
        for hook in cfg[0]["webhooks"]:
            assert hook["clientConfig"].get("caBundle") and "service" in hook["clientConfig"], hook
    # The agent on the node publishes what it enforces.
    labels = wait_until(lambda: (ls := kubectl_json(node, "get", "node", NODE_NAME)["metadata"]["labels"])
                        .get("gpufrac.io/gpu-count") == str(len(GPU_UUIDS)) and ls, 60, "the agent's labels")
    assert labels["gpufrac.io/enforcement.sm-sharing"] != "none"


# ---- the seed pods -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", list(SEED_EXAMPLES))
def test_seed_pods_start_after_the_bind_and_see_their_bind_time_limits(node: RealCluster, installed, seed):
    filename, mode = SEED_EXAMPLES[seed]
    expected = SEED_ENV[seed]
    res = create(node, example(filename, seed))
    assert res.rc == 0, res.stderr
    assert get_pod(node, seed)["status"].get("phase") == "Pending"  # kai-scheduler's: nothing schedules it
    bind(node, seed, SEED_BINDS[seed])
    wait_running(node, seed)
    env = dict(line.split("=", 1) for line in exec_in(node, seed, "env").splitlines() if "=" in line)
    for key, value in expected.items():
        assert env.get(key) == value, f"{key}: {env.get(key)!r} inside the container, expected {value!r}"
    pipe_dir = f"/run/gpufrac/mps/{mode}"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe_dir
    mounts = exec_in(node, seed, "cat /proc/mounts")
    assert f" {pipe_dir} " in mounts, mounts
    # The agent's MPS daemon for this mode listens in the mounted directory.
    assert "control" in exec_in(node, seed, f"ls {pipe_dir}").split()
    if seed == "inference":
        # KAI never places the time-slicing notebook on GPUs serving sm-sharing, and the agent's NRI plugin refuses
        # it there: the inference server (every GPU of the node) makes room for it (kept for the tests below)
        node.kubectl("delete", "pod", seed, "-n", USER_NAMESPACE, "--grace-period=0", "--force", "--wait=true",
                     user="admin")


# ---- workloads -----------------------------------------------------------------------------------------------


def test_a_fractional_deployment_is_admitted_through_the_replicaset_controller(node: RealCluster, installed):
    name = unique("fractional-deploy")
    template = fractional_pod(name)
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": USER_NAMESPACE},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name},
                                           "annotations": template["metadata"]["annotations"]},
                              "spec": template["spec"]}},
    }
    assert create(node, deployment).rc == 0
    pods = wait_until(lambda: (items := kubectl_json(node, "get", "pods", "-n", USER_NAMESPACE, "-l",
                                                     f"app={name}")["items"]) and len(items) == 2 and items,
                      60, "the ReplicaSet's two pods")
    for p in pods:
        assert p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        assert p["metadata"]["labels"].get("gpufrac.io/fractional") == "true"
        env = {e["name"] for e in p["spec"]["containers"][0].get("env", [])}
        assert {"NVIDIA_GPU_MEMORY_LIMIT", "CUDA_MPS_PIPE_DIRECTORY"} <= env, env
    node.kubectl("delete", "deployment", name, "-n", USER_NAMESPACE, "--wait=false")


def test_a_pod_without_fractions_runs_untouched(node: RealCluster, installed):
    name = unique("plain")
    assert create(node, plain_pod(name)).rc == 0
    p = wait_running(node, name)
    assert "gpufrac.io/fractional" not in p["metadata"].get("labels", {})
    assert not any(a.startswith("gpufrac.io/") for a in p["metadata"].get("annotations", {}))
    assert "env" not in p["spec"]["containers"][0]
    assert p["spec"]["nodeName"] == NODE_NAME  # the default scheduler placed it
    node.kubectl("delete", "pod", name, "-n", USER_NAMESPACE, "--wait=false")


# ---- the agent on real processes -----------------------------------------------------------------------------


def test_the_agent_attributes_the_containers_real_processes(node: RealCluster, installed):
    wait_running(node, "notebook")
    pids = host_pids(node, "notebook")
    assert pids, "no process in the notebook's container"
    gpus = node.gpu_state()
    gpus.processes(GPU_UUIDS[0], [{"pid": pids[0], "used_memory_mib": 1000, "sm_util": 10}])
    labels = {"namespace": USER_NAMESPACE, "pod": "notebook", "container": "app", "UUID": GPU_UUIDS[0]}
    wait_until(lambda: metric_value(agent_metrics(node), "gpufrac_container_gpu_memory_used_bytes",
                                    **labels) == 1000 * MIB, 60, "the notebook's usage in the agent's metrics")
    assert metric_value(agent_metrics(node), "gpufrac_container_gpu_memory_limit_bytes", **labels) == 115016 * MIB

    # Over its limit: the agent says so on the pod.
    gpus.processes(GPU_UUIDS[0], [{"pid": pids[0], "used_memory_mib": 120000, "sm_util": 10}])

    def over_limit_events():
        events = kubectl_json(node, "get", "events", "-n", USER_NAMESPACE, "--field-selector",
                              "involvedObject.name=notebook")["items"]
        return [e for e in events if e["reason"] == "GPUMemoryLimitExceeded"]

    [event] = wait_until(over_limit_events, 60, "the over-limit event")
    assert event["type"] == "Warning"
    gpus.processes(GPU_UUIDS[0], [])


# ---- the webhook under disruption ----------------------------------------------------------------------------


class Creator(threading.Thread):
    """Creates a fractional pod every `interval` seconds until stopped; records every failure."""

    def __init__(self, node: RealCluster, prefix: str, interval: float = 0.3) -> None:
        super().__init__(daemon=True)
        self.node, self.prefix, self.interval = node, prefix, interval
        self.stop_event = threading.Event()
        self.created: list[str] = []
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop_event.is_set():
            name = unique(self.prefix)
            res = create(self.node, fractional_pod(name))
            (self.created.append(name) if res.rc == 0 else self.failures.append(f"{name}: {res.stderr.strip()}"))
            self.stop_event.wait(self.interval)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(60)
        if self.created:
            self.node.kubectl("delete", "pod", "-n", USER_NAMESPACE, "--wait=false", *self.created)


class NodeSampler(threading.Thread):
    """Reads the node every `interval` seconds until stopped: which of the agent's labels and conditions it has."""

    def __init__(self, node: RealCluster, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.node, self.interval = node, interval
        self.stop_event = threading.Event()
        self.samples: list[set[str]] = []

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.samples.append(set(gpufrac_leftovers(kubectl_json(self.node, "get", "node", NODE_NAME))))
            self.stop_event.wait(self.interval)

    def finish(self) -> list[set[str]]:
        self.stop_event.set()
        self.join(30)
        return self.samples


def test_losing_one_webhook_pod_keeps_admission_working(node: RealCluster, installed):
    victim = webhook_pods(node)[0]["metadata"]["name"]
    creator = Creator(node, "during-kill")
    creator.start()
    try:
        res = node.kubectl("delete", "pod", victim, "-n", RELEASE_NAMESPACE, "--grace-period=0", "--force",
                           user="admin")
        assert res.rc == 0, res.stderr
        time.sleep(5)
    finally:
        creator.finish()
    assert creator.failures == [], creator.failures[:5]
    assert len(creator.created) >= 5
    wait_until(lambda: len([p for p in webhook_pods(node) if p["status"].get("phase") == "Running"]) == 2, 120,
               "the Deployment to replace the killed pod")


def test_without_any_webhook_pod_fractional_pods_are_refused_and_others_are_not(node: RealCluster, installed):
    assert node.kubectl("scale", "deployment", "gpufrac-webhook", "-n", RELEASE_NAMESPACE, "--replicas=0",
                        user="admin").rc == 0
    try:
        wait_until(lambda: not webhook_pods(node), 120, "both webhook pods gone")
        res = wait_until(lambda: (r := create(node, fractional_pod(unique("no-webhook")))).rc != 0 and r, 30,
                         "a refusal")
        assert "failed calling webhook" in res.stderr and "gpufrac.io" in res.stderr, res.stderr
        plain = unique("plain-no-webhook")
        assert create(node, plain_pod(plain)).rc == 0, "a pod without fractions must not depend on the webhook"
        node.kubectl("delete", "pod", plain, "-n", USER_NAMESPACE, "--wait=false")
    finally:
        node.kubectl("scale", "deployment", "gpufrac-webhook", "-n", RELEASE_NAMESPACE, "--replicas=2", user="admin")
        node.kubectl("rollout", "status", "deployment/gpufrac-webhook", "-n", RELEASE_NAMESPACE, "--timeout=180s",
                     timeout=200, user="admin")


def test_helm_upgrade_rolls_both_while_pods_are_created_without_a_failure(node: RealCluster, installed: Helm):
    before = {p["metadata"]["name"] for p in webhook_pods(node)}
    creator, sampler = Creator(node, "during-upgrade"), NodeSampler(node)
    creator.start()
    sampler.start()
    try:
        stamp = f"r{int(time.time())}"
        installed.upgrade(f"webhook.podAnnotations.e2e-rollout={stamp}", f"agent.podAnnotations.e2e-rollout={stamp}")
    finally:
        creator.finish()
        samples = sampler.finish()
    # The agent replaced by the rollout withdrew nothing: its labels and conditions stayed on the node throughout.
    published = {"gpufrac.io/enforcement.time-slicing", "gpufrac.io/enforcement.sm-sharing", "gpufrac.io/gpu-count",
                 "gpufrac.io/Ready", *KAI_CONDITIONS}
    assert len(samples) >= 5 and all(published <= sample for sample in samples), \
        [sorted(published - sample) for sample in samples if not published <= sample][:3]
    # helm --wait returns once the new pods are ready; the old ones may still be terminating (and listed) then.
    wait_until(lambda: not before & {p["metadata"]["name"] for p in webhook_pods(node)}, 120,
               "the webhook Deployment's old pods replaced")
    ds = kubectl_json(node, "get", "daemonset", "gpufrac-agent", "-n", RELEASE_NAMESPACE)
    assert ds["spec"]["template"]["metadata"]["annotations"]["e2e-rollout"] == stamp
    assert ds["status"].get("updatedNumberScheduled") == 1
    assert creator.failures == [], creator.failures[:5]
    assert len(creator.created) >= 10, creator.created


# ---- uninstall -----------------------------------------------------------------------------------------------


MPS_LOG_ROOT = Path("/var/log/gpufrac/mps")  # mps.logRoot, a hostPath: the node's containers write the machine's


def last_daemon_records(mode: str) -> list[dict]:
    """What the fake MPS control daemon of the release's `mode` container recorded, from its last start on."""
    lines = (MPS_LOG_ROOT / mode / "fake-mps-record.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    last = max(i for i, r in enumerate(records) if r["event"] == "start")
    return [r for r in records[last:] if r.get("pid") == records[last]["pid"]]


class HookLog(threading.Thread):
    """Follows the log of the uninstall hook's pod (its Job is deleted once it succeeds): its summary line."""

    def __init__(self, node: RealCluster) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.stop_event = threading.Event()
        self.lines: list[dict] = []

    def run(self) -> None:
        while not self.stop_event.wait(0.2):
            res = self.node.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-l",
                                    "app.kubernetes.io/component=agent-withdraw", "-o", "name", user="admin")
            if res.rc == 0 and res.stdout.strip():
                pod = res.stdout.split()[0]
                out = self.node.kubectl("logs", "-f", pod, "-n", RELEASE_NAMESPACE, user="admin", timeout=300)
                if out.rc == 0:
                    self.lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
                    return

    def summary(self) -> dict:
        self.stop_event.set()
        self.join(30)
        return next((line for line in reversed(self.lines) if "total_s" in line), {})


def test_helm_uninstall_withdraws_the_agents_and_leaves_no_webhook_configuration(node: RealCluster, installed: Helm):
    before = kubectl_json(node, "get", "node", NODE_NAME)
    assert {"gpufrac.io/enforcement.time-slicing", "gpufrac.io/gpu-count", "gpufrac.io/Ready",
            *KAI_CONDITIONS} <= set(gpufrac_leftovers(before)), "the agent published nothing"
    assert Path("/run/gpufrac/nri").is_dir(), "the agent's NRI lock directory, which the uninstall must remove"
    agent_pod = kubectl_json(node, "get", "pods", "-n", RELEASE_NAMESPACE, "-l",
                             "app.kubernetes.io/component=agent")["items"][0]["metadata"]["name"]
    agent_log: list[str] = []
    follow = threading.Thread(target=lambda: agent_log.append(node.kubectl(
        "logs", "-f", agent_pod, "-n", RELEASE_NAMESPACE, "--since=5s", user="admin", timeout=300).stdout),
        daemon=True)
    follow.start()
    hook_log = HookLog(node)
    hook_log.start()
    started = time.monotonic()
    installed.uninstall()
    took = time.monotonic() - started
    hook = hook_log.summary()
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        names = [c["metadata"]["name"] for c in kubectl_json(node, "get", kind)["items"]]
        assert not [n for n in names if "gpufrac" in n], names
    # The pre-delete hook stopped the agents, took their labels and conditions off the node, then stopped the MPS
    # daemons: all of it before helm returned, with nothing to wait for afterwards.
    after = kubectl_json(node, "get", "node", NODE_NAME)
    assert gpufrac_leftovers(after) == [], gpufrac_leftovers(after)
    annotations = [k for k in after["metadata"].get("annotations") or {} if k.startswith("gpufrac.io/")]
    assert annotations == [], annotations
    # The agents, stopping with their DaemonSet gone, removed the release's host paths (docs/operations.md,
    # "Uninstall"): the NRI lock, the MPS pipe directories and shared memory, the DRA state.
    follow.join(30)
    withdrawn = [line for line in "".join(agent_log).splitlines() if "uninstalled" in line or "host paths" in line]
    left = [str(p) for top in HOST_PATHS for p in [Path(top), *Path(top).rglob("*")] if p.exists()]
    assert left == [], (left, withdrawn or "".join(agent_log)[-3000:])
    assert after["metadata"]["labels"]["kubernetes.io/hostname"] == before["metadata"]["labels"][
        "kubernetes.io/hostname"]
    assert "Ready" in {c["type"] for c in after["status"]["conditions"]}, "the kubelet's own conditions stay"
    pods = kubectl_json(node, "get", "pods", "-n", RELEASE_NAMESPACE, "-l",
                        "app.kubernetes.io/component in (agent, mps)")["items"]
    assert pods == [], [p["metadata"]["name"] for p in pods]
    for mode in ("time-slicing", "sm-sharing"):
        records = last_daemon_records(mode)
        assert any(r["event"] == "command" and r["command"] == "quit" for r in records), records
        assert [r["code"] for r in records if r["event"] == "exit"] == [0], f"the {mode} daemon did not quit cleanly"
    leftover_hooks = kubectl_json(node, "get", "jobs,serviceaccounts", "-n", RELEASE_NAMESPACE)["items"]
    assert not [o for o in leftover_hooks if o["metadata"]["name"].endswith("-withdraw")], "hook-succeeded deletes it"
    print(f"[e2e] helm uninstall with the pre-delete hook took {took:.1f} s; the hook's own summary (agents "
          f"stopped, MPS daemons stopped, in all, s): {hook.get('agents_stopped_s')}, {hook.get('mps_stopped_s')}, "
          f"{hook.get('total_s')}")
    for kind in ("validatingadmissionpolicies", "validatingadmissionpolicybindings"):
        names = [c["metadata"]["name"] for c in kubectl_json(node, "get", kind)["items"]]
        assert not [n for n in names if "gpufrac" in n], names
    # Pod creation does not depend on anything gpufrac left behind, once the API server's admission has followed the
    # deletions (its policy informers: seconds on a loaded machine).
    name = unique("after-uninstall")
    wait_until(lambda: create(node, fractional_pod(name)).rc == 0, 60, "a fractional pod created after the uninstall",
               interval=1)
    node.kubectl("delete", "pod", name, "-n", USER_NAMESPACE, "--wait=false")
