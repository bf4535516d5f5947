"""Issue 11 on the real node, through the real kubelet: it mounts the MPS directories through gpufrac's CSI driver
(no hostPath, so a `baseline` namespace runs the seed pods), the driver refuses what it must, the MPS daemons
outlive the agent, and KAI's readiness condition follows the daemons.

Runs against the session's real node and release (tests/node/conftest.py), before test_real_node.py (which ends
with the uninstall). Every test leaves the release as it found it: CSI delivery, the agent Ready on the node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.agent_on_node import (
    DRIVER,
    KAI_CONDITION,
    MODES,
    MPS_ROOT,
    OWN_CONDITION,
    agent_ready,
    both_ready,
    condition,
    daemon_pids,
    delete,
    registered_drivers,
    seed_pod,
    start_seed,
)
from e2e.agent_world import metric_value
from e2e.install import Helm
from e2e.names import NODE_NAME, RELEASE_NAMESPACE, REPO_ROOT, USER_NAMESPACE
from e2e.node import RealCluster
from e2e.pods import (
    SEED_BINDS,
    SEED_ENV,
    SEED_EXAMPLES,
    agent_metrics,
    bind,
    create,
    events,
    exec_in,
    get_json,
    get_pod,
    plain_pod,
    release_pods,
    wait_running,
)
from e2e.testing import unique
from e2e.toolkit.wait import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]

AGENT_DS = "gpufrac-agent"
LOG_ROOT = Path("/var/log/gpufrac/mps")


# ---- what the node shows -------------------------------------------------------------------------------------


def commands_received(mode: str, pid: int) -> list[str]:
    """The commands the fake nvidia-cuda-mps-control of this PID recorded (testkit/fakes, `-f` daemon mode)."""
    path = LOG_ROOT / mode / "fake-mps-record.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["command"] for r in records if r["event"] == "command" and r["pid"] == pid]


def mount_failure(node: RealCluster, name: str, text: str) -> str | None:
    return next((e["message"] for e in events(node, name) if e["reason"] == "FailedMount" and text in e["message"]),
                None)


def waiting_reason(node: RealCluster, name: str) -> str | None:
    """Why the pod's app container has not started (None: it has, or the kubelet has not looked at it yet)."""
    p = get_pod(node, name)
    statuses = p["status"].get("containerStatuses") or []
    return next((s["state"]["waiting"].get("reason") for s in statuses if "waiting" in s.get("state", {})), None)


def volume_dir(node: RealCluster, pod_obj: dict, volume: str) -> Path:
    """Where the kubelet keeps a pod's CSI volume: <root>/pods/<uid>/volumes/kubernetes.io~csi/<name>."""
    return (node.node_root / "kubelet" / "pods" / pod_obj["metadata"]["uid"] / "volumes" / "kubernetes.io~csi" /
            volume)


def readme_quote_after(marker: str) -> str:
    """The first fenced block of docs/agent.md (the delivery section, moved there from the README) after `marker`,
    its lines joined as the terminal printed them."""
    text = (REPO_ROOT / "docs" / "agent.md").read_text()
    after = text[text.index(marker):]
    block = re.search(r"```\n(.*?)```", after, re.S)
    assert block, f"no quoted block after {marker!r} in docs/agent.md"
    return " ".join(line.strip() for line in block.group(1).splitlines() if line.strip())


# ---- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture
def baseline(node: RealCluster) -> Iterator[None]:
    """The tenant namespace enforces Pod Security baseline for the test."""
    res = node.kubectl("label", "namespace", USER_NAMESPACE, "pod-security.kubernetes.io/enforce=baseline",
                       "--overwrite", user="admin")
    assert res.rc == 0, res.stderr
    yield
    node.kubectl("label", "namespace", USER_NAMESPACE, "pod-security.kubernetes.io/enforce-", user="admin")


@pytest.fixture(scope="module")
def settled(node: RealCluster, installed: Helm) -> Helm:
    """The release is up: the kubelet lists the driver and the agent reports both daemons up."""
    wait_until(lambda: DRIVER in registered_drivers(node), 120, "the kubelet to register the CSI driver", interval=1)
    wait_until(lambda: both_ready(node), 120, "both Ready conditions True", interval=1)
    wait_until(lambda: all(len(p) == 1 for p in daemon_pids().values()), 60, "one MPS daemon per mode", interval=1)
    return installed


@pytest.fixture
def after_each(node: RealCluster, settled: Helm) -> Iterator[Helm]:
    """Each test starts, and leaves, with the agent Ready and the driver registered."""
    yield settled
    wait_until(lambda: agent_ready(node), 180, "the agent Ready again", interval=1)
    wait_until(lambda: DRIVER in registered_drivers(node), 120, "the driver registered again", interval=1)
    wait_until(lambda: both_ready(node), 120, "both Ready conditions True again", interval=1)


# ---- the driver and Pod Security -----------------------------------------------------------------------------


def test_the_chart_installs_the_csi_driver_and_the_kubelet_registers_it(node: RealCluster, settled: Helm):
    driver = get_json(node, "get", "csidriver", DRIVER)
    assert driver["spec"]["volumeLifecycleModes"] == ["Ephemeral"] and driver["spec"]["podInfoOnMount"] is True
    csinode = get_json(node, "get", "csinode", NODE_NAME)
    assert [d["nodeID"] for d in csinode["spec"]["drivers"] if d["name"] == DRIVER] == [NODE_NAME]


@pytest.mark.parametrize("seed", list(SEED_EXAMPLES))
def test_seed_pods_run_in_a_baseline_namespace_with_the_pipe_directory_from_the_driver(node: RealCluster,
                                                                                       after_each, baseline, seed):
    mode = SEED_EXAMPLES[seed][1]
    name = unique(f"csi-{seed}")
    p = start_seed(node, seed, name)
    volume = f"gpufrac-mps-{mode}"
    assert not [v for v in p["spec"]["volumes"] if "hostPath" in v]
    assert [v for v in p["spec"]["volumes"] if "csi" in v] == [{"name": volume, "csi": {
        "driver": DRIVER, "volumeAttributes": {"mode": mode}}}]
    # The kubelet mounted it through gpufrac's driver: its record of the volume names the driver.
    vol_data = json.loads((volume_dir(node, p, volume) / "vol_data.json").read_text())
    assert vol_data["driverName"] == DRIVER and vol_data["volumeLifecycleMode"] == "Ephemeral", vol_data
    env = dict(line.split("=", 1) for line in exec_in(node, name, "env").splitlines() if "=" in line)
    for key, value in SEED_ENV[seed].items():
        assert env.get(key) == value, f"{key}: {env.get(key)!r} inside the container, expected {value!r}"
    pipe_dir = SEED_ENV[seed]["CUDA_MPS_PIPE_DIRECTORY"]
    # What the fake MPS daemon wrote in its pipe directory on the host, seen inside through the kubelet's mount.
    on_host = (MPS_ROOT / mode / "fake-context-share").read_text()
    assert exec_in(node, name, f"cat {pipe_dir}/fake-context-share") == on_host
    assert exec_in(node, name, f"test -S {pipe_dir}/control && echo socket").strip() == "socket"
    mounts = exec_in(node, name, "cat /proc/mounts")
    assert f" {pipe_dir} " in mounts and " /dev/shm " in mounts, mounts
    # /dev/shm is the daemons' shared memory on the host.
    exec_in(node, name, f"echo {name} > /dev/shm/{name}")
    shm_file = MPS_ROOT / "shm" / name
    try:
        assert shm_file.read_text().strip() == name
    finally:
        shm_file.unlink(missing_ok=True)
    delete(node, name)


def upgrade_delivery(node: RealCluster, helm: Helm, delivery: str) -> None:
    """`helm upgrade --set mps.delivery=...`, until the webhook pods of before are gone: helm --wait returns once
    the new ones are ready, and an old one may still answer (with the other delivery) until it has gone."""
    old = {p["metadata"]["name"] for p in release_pods(node, "webhook")}
    helm.upgrade(f"mps.delivery={delivery}")
    wait_until(lambda: not old & {p["metadata"]["name"] for p in
                                  get_json(node, "get", "pods", "-n", RELEASE_NAMESPACE, "-l",
                                           "app.kubernetes.io/component=webhook")["items"]}, 120,
               "the old webhook pods gone", interval=1)


def test_with_the_hostpath_delivery_pod_security_refuses_them_with_the_message_the_readme_quotes(
        node: RealCluster, after_each: Helm, baseline):
    upgrade_delivery(node, after_each, "hostPath")
    try:
        for seed, (filename, mode) in SEED_EXAMPLES.items():
            # As the README shows it: kubectl create -f examples/<file>, from the repository's root.
            res = node.kubectl("create", "-n", USER_NAMESPACE, "-f", f"examples/{filename}")
            assert res.rc != 0, f"{seed} was admitted in a baseline namespace with hostPath volumes"
            print(res.stderr)
            assert f'pods "{seed}" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes ' \
                   f'(volumes "gpufrac-mps-{mode}", "gpufrac-mps-shm")' in res.stderr, res.stderr
            if seed == "inference":
                quoted = readme_quote_after("server refuses the pods with Pod Security's own message")
                assert " ".join(res.stderr.split()) == quoted, res.stderr
    finally:
        upgrade_delivery(node, after_each, "csi")
        delete(node, *SEED_EXAMPLES)


# ---- what the driver refuses ---------------------------------------------------------------------------------


def test_a_pod_that_is_not_fractional_is_refused_by_node_publish_volume(node: RealCluster, after_each):
    name = unique("csi-plain")
    manifest = plain_pod(name)
    manifest["spec"]["volumes"] = [{"name": "mps", "csi": {"driver": DRIVER,
                                                           "volumeAttributes": {"mode": "sm-sharing"}}}]
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "mps", "mountPath": "/mps"}]
    res = create(node, manifest)
    assert res.rc == 0, res.stderr  # not fractional: the webhook never sees it
    message = wait_until(lambda: mount_failure(node, name, "is not a GPU-fraction pod"), 120,
                         "NodePublishVolume's refusal in the pod's events", interval=1)
    print(message)
    assert f'MountVolume.SetUp failed for volume "mps" : rpc error: code = FailedPrecondition desc = pod ' \
           f'{USER_NAMESPACE}/{name} is not a GPU-fraction pod' in message, message
    assert get_pod(node, name)["status"].get("phase") == "Pending"
    assert waiting_reason(node, name) in (None, "ContainerCreating")
    delete(node, name)


def test_with_the_agent_stopped_a_fractional_pod_does_not_start(node: RealCluster, after_each):
    """The agent stops on this node as it does when its pod goes (drain, eviction, a nodeSelector that no longer
    matches): SIGTERM, it removes its registration socket, the kubelet deregisters the driver."""
    away = {"spec": {"template": {"spec": {"nodeSelector": {"gpufrac.io/e2e-agent-away": "true"}}}}}
    res = node.kubectl("patch", "daemonset", AGENT_DS, "-n", RELEASE_NAMESPACE, "--type=merge", "-p",
                       json.dumps(away), user="admin")
    assert res.rc == 0, res.stderr
    name = unique("csi-no-agent")
    try:
        wait_until(lambda: not release_pods(node, "agent"), 120, "the agent pod to go", interval=1)
        wait_until(lambda: DRIVER not in registered_drivers(node), 60, "the kubelet to deregister the driver",
                   interval=1)
        # What an operator sees on the node, and what KAI's scheduler gates on: the agent said it stopped.
        for kind in (OWN_CONDITION, KAI_CONDITION):
            stopped = condition(node, kind)
            assert (stopped.get("status"), stopped.get("reason")) == ("Unknown", "AgentStopped"), stopped
        assert create(node, seed_pod("notebook", name)).rc == 0
        bind(node, name, SEED_BINDS["notebook"])
        message = wait_until(lambda: mount_failure(node, name, DRIVER), 120, "the kubelet's mount failure",
                             interval=1)
        print(message)
        assert 'MountVolume.SetUp failed for volume "gpufrac-mps-time-slicing" : ' in message, message
        assert f"driver name {DRIVER} not found in the list of registered CSI drivers" in message, message
        assert get_pod(node, name)["status"].get("phase") == "Pending"
        assert waiting_reason(node, name) in (None, "ContainerCreating")
    finally:
        back = {"spec": {"template": {"spec": {"nodeSelector": {"gpufrac.io/e2e-agent-away": None}}}}}
        node.kubectl("patch", "daemonset", AGENT_DS, "-n", RELEASE_NAMESPACE, "--type=merge", "-p",
                     json.dumps(back), user="admin")
    wait_until(lambda: agent_ready(node), 180, "the agent back", interval=1)
    wait_running(node, name, timeout=240)  # the kubelet retries the mount: with the agent back, the pod starts
    delete(node, name)


# ---- MPS that outlives the agent -----------------------------------------------------------------------------


def assert_daemons_survived(node: RealCluster, before: dict[str, list[int]], client: str) -> None:
    assert daemon_pids() == before, "the MPS control daemons kept their PIDs"
    for mode, (pid,) in before.items():
        assert "quit" not in commands_received(mode, pid), f"the {mode} daemon (pid {pid}) was sent quit"
    # A client started before still reaches its daemon through the kubelet's mount.
    pipe_dir = SEED_ENV["inference"]["CUDA_MPS_PIPE_DIRECTORY"]
    assert exec_in(node, client, f"test -S {pipe_dir}/control && echo socket").strip() == "socket"
    # The agent reports the daemons up again (the new agent process: its own metrics and conditions).
    wait_until(lambda: both_ready(node), 90, "the agent to report both daemons up", interval=1)
    text = wait_until(lambda: (t := agent_metrics(node)) and
                      all(metric_value(t, "gpufrac_mps_daemon_up", mode=mode) == 1 for mode in MODES) and t, 60,
                      "gpufrac_mps_daemon_up 1 for both modes", interval=1)
    assert text
    # And it serves the driver again: a pod bound now gets its mount.
    wait_until(lambda: DRIVER in registered_drivers(node), 60, "the driver registered again", interval=1)
    name = unique("csi-after-agent")
    start_seed(node, "inference", name)  # the client's mode: its GPUs serve sm-sharing (the NRI plugin's rule)
    delete(node, name)


@pytest.fixture(scope="module")
def mps_client(node: RealCluster, settled: Helm) -> Iterator[str]:
    """An sm-sharing pod running across the agent's restarts."""
    name = unique("csi-client")
    start_seed(node, "inference", name)
    yield name
    delete(node, name)


def test_killing_the_agent_container_leaves_the_mps_daemons_running(node: RealCluster, after_each, mps_client):
    before = daemon_pids()
    assert all(len(pids) == 1 for pids in before.values()), before
    agent = agent_ready(node)
    assert agent, "no Ready agent pod"
    status = agent["status"]["containerStatuses"][0]
    restarts = status.get("restartCount", 0)
    container_id = status["containerID"].removeprefix("containerd://")
    tasks = node.containerd.ctr("tasks", "ls").stdout.splitlines()
    (line,) = [ln for ln in tasks if ln.startswith(container_id)]
    os.kill(int(line.split()[1]), signal.SIGKILL)  # as the OOM killer does: no SIGTERM, no cleanup
    wait_until(lambda: (p := agent_ready(node)) and
               p["status"]["containerStatuses"][0].get("restartCount", 0) > restarts, 180,
               "the kubelet to restart the agent container", interval=1)
    assert_daemons_survived(node, before, mps_client)


def test_rolling_the_agent_daemonset_leaves_the_mps_daemons_running(node: RealCluster, after_each, mps_client):
    before = daemon_pids()
    assert all(len(pids) == 1 for pids in before.values()), before
    old = agent_ready(node)
    assert old, "no Ready agent pod"
    mps_restarts = [c.get("restartCount", 0) for p in release_pods(node, "mps")
                    for c in p["status"]["containerStatuses"]]
    res = node.kubectl("rollout", "restart", f"daemonset/{AGENT_DS}", "-n", RELEASE_NAMESPACE, user="admin")
    assert res.rc == 0, res.stderr
    wait_until(lambda: (p := agent_ready(node)) and p["metadata"]["uid"] != old["metadata"]["uid"], 180,
               "a new agent pod Ready", interval=1)
    assert_daemons_survived(node, before, mps_client)
    assert [c.get("restartCount", 0) for p in release_pods(node, "mps")
            for c in p["status"]["containerStatuses"]] == mps_restarts


# ---- KAI's readiness condition -------------------------------------------------------------------------------


def test_the_kai_condition_flips_false_while_a_daemon_is_down_and_back(node: RealCluster, after_each):
    before = daemon_pids()
    (old,) = before["sm-sharing"]
    flag = LOG_ROOT / "sm-sharing" / "fake-crash"  # the fake daemon exits 1 while it exists
    flag.write_text("")
    try:
        down = wait_until(lambda: (c := condition(node, KAI_CONDITION)) and c.get("status") == "False" and c, 60,
                          "the KAI condition False", interval=0.5)
        print(down)
        assert down["reason"] == "MpsDaemonRestarting", down
        assert "the sm-sharing MPS control daemon exited with code 1 and is being restarted" in down["message"]
        own = condition(node, OWN_CONDITION)
        assert (own["status"], own["reason"]) == ("False", "MpsDaemonRestarting"), own
    finally:
        flag.unlink()
    started = time.monotonic()
    back = wait_until(lambda: (c := condition(node, KAI_CONDITION)) and c.get("status") == "True" and c, 120,
                      "the KAI condition True again", interval=1)
    print(f"True again {time.monotonic() - started:.0f} s after the flag went: {back}")
    assert back["reason"] == "FractionsEnforced", back
    after = daemon_pids()
    assert len(after["sm-sharing"]) == 1 and after["sm-sharing"] != [old], "a new sm-sharing daemon"
    assert after["time-slicing"] == before["time-slicing"], "the other mode's daemon was left alone"
    text = agent_metrics(node)
    assert metric_value(text, "gpufrac_mps_daemon_restarts_total", mode="sm-sharing") >= 1
    assert metric_value(text, "gpufrac_mps_daemon_up", mode="sm-sharing") == 1
