"""The pod cache: list, watch, resume after disconnects, relist on 410 Gone; node publishing; CLI flags."""

from __future__ import annotations

import argparse
import datetime as dt
import threading
from types import SimpleNamespace

import pytest

from gpufrac.agent.decide.capabilities import CONDITION_TYPE
from gpufrac.agent.decide.errors import ConfigError
from gpufrac.agent.decide.model import ConditionStatus, NodeCondition
from gpufrac.agent.edges.kube import pod_selectors
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.node import NodePublisher
from gpufrac.agent.edges.podwatch import PodCache, apply_event
from gpufrac.agent.programs.node_agent import add_arguments, config_from_args, probe_server
from gpufrac.core.annotations import ComputeMode
from gpufrac.kube.errors import ApiError, GoneError


def obj(uid: str, rv: str, name: str | None = None) -> dict:
    return {"metadata": {"uid": uid, "name": name or uid, "resourceVersion": rv}}


class ScriptedSource:
    """Plays a script of watch outcomes: a list of events, then an exception or a normal end."""

    def __init__(self, lists: list[list[dict]], watches: list[tuple[list[dict], Exception | None]]) -> None:
        self.lists = lists
        self.watches = watches
        self.list_calls = 0
        self.watch_versions: list[str] = []
        self.done = threading.Event()

    def list_pods(self, node):
        items = self.lists[min(self.list_calls, len(self.lists) - 1)]
        self.list_calls += 1
        return items, f"list-{self.list_calls}"

    def watch_pods(self, node, resource_version, timeout_seconds):
        self.watch_versions.append(resource_version)
        if not self.watches:
            self.done.set()
            threading.Event().wait(0.02)
            return
        events, error = self.watches.pop(0)
        yield from events
        if error is not None:
            raise error


def run_cache(source: ScriptedSource) -> tuple[PodCache, list[int]]:
    reconnects: list[int] = []
    cache = PodCache(source, "gpu-node-1", retry_delay=0.0, on_reconnect=lambda: reconnects.append(1))
    cache.start()
    assert source.done.wait(10)
    cache.stop()
    return cache, reconnects


def test_selectors_are_label_and_node():
    assert pod_selectors("n1") == {"label_selector": "gpufrac.io/fractional=true",
                                   "field_selector": "spec.nodeName=n1"}


def test_apply_event():
    pods: dict = {}
    assert apply_event(pods, {"type": "ADDED", "object": obj("a", "5")}) == "5"
    apply_event(pods, {"type": "MODIFIED", "object": obj("a", "6", name="renamed")})
    assert pods["a"]["metadata"]["name"] == "renamed"
    assert apply_event(pods, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}) == "9"
    apply_event(pods, {"type": "DELETED", "object": obj("a", "10")})
    assert pods == {}


def test_watch_resumes_from_the_last_version_after_a_disconnect():
    source = ScriptedSource(
        lists=[[obj("a", "1")]],
        watches=[([{"type": "ADDED", "object": obj("b", "7")}], ConnectionResetError("peer reset")),
                 ([{"type": "DELETED", "object": obj("a", "8")}], None)])
    cache, reconnects = run_cache(source)
    assert source.list_calls == 1  # no relist for a plain disconnect
    assert source.watch_versions[:2] == ["list-1", "7"]
    assert source.watch_versions[2] == "8"  # a normal end of the watch resumes too, without counting
    assert [p["metadata"]["uid"] for p in cache.snapshot()] == ["b"]
    assert reconnects == [1]


def test_gone_relists_and_replaces_the_cache():
    source = ScriptedSource(
        lists=[[obj("a", "1"), obj("b", "1")], [obj("c", "20")]],
        watches=[([], GoneError("too old")), ([], ApiError("500", 500))])
    cache, reconnects = run_cache(source)
    assert source.list_calls == 2
    assert source.watch_versions[:2] == ["list-1", "list-2"]
    assert [p["metadata"]["uid"] for p in cache.snapshot()] == ["c"]
    assert cache.synced.is_set()
    assert len(reconnects) == 2


class Sink:
    def __init__(self) -> None:
        self.labels: list[dict] = []
        self.conditions: list[dict] = []
        self.fail = False

    def patch_node_labels(self, node, labels):
        if self.fail:
            raise ApiError("boom", 500)
        self.labels.append(labels)

    def patch_node_condition(self, node, condition):
        self.conditions.append(condition)


def test_node_publisher_patches_on_change_and_heartbeat():
    now = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    sink = Sink()
    pub = NodePublisher(sink, "n1", heartbeat=300, now=lambda: now[0])
    ready = NodeCondition(ConditionStatus.TRUE, "FractionsEnforced", "ok")
    pub.publish({"a": "1"}, ready)
    pub.publish({"a": "1"}, ready)
    assert len(sink.labels) == 1 and len(sink.conditions) == 1
    first = sink.conditions[0]
    assert first == {"type": CONDITION_TYPE, "status": "True", "reason": "FractionsEnforced", "message": "ok",
                     "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    now[0] += dt.timedelta(seconds=301)
    pub.publish({"a": "1"}, ready)
    assert len(sink.conditions) == 2 and "lastTransitionTime" not in sink.conditions[1]  # heartbeat only
    pub.publish({"a": "1"}, NodeCondition(ConditionStatus.FALSE, "MpsDaemonFailed", "x"))
    assert sink.conditions[2]["lastTransitionTime"] == sink.conditions[2]["lastHeartbeatTime"]
    sink.fail = True
    assert not pub.try_publish({"a": "2"}, ready)
    sink.fail = False
    assert pub.try_publish({"a": "2"}, ready)  # retried
    assert sink.labels[-1] == {"a": "2"}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_flags(monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    config = config_from_args(parse("--node", "n1", "--modes", "sm-sharing", "--proc-root", "/host/proc",
                                    "--max-restarts", "0", "--restart-backoff", "2", "--evict-on-violation"))
    assert config.node == "n1" and config.modes == (ComputeMode.SM_SHARING,)
    assert str(config.proc_root) == "/host/proc" and config.evict_on_violation
    assert (config.restart_policy.max_restarts, config.restart_policy.initial_backoff) == (0, 2)
    with pytest.raises(ConfigError, match="--node"):
        config_from_args(parse())
    with pytest.raises(SystemExit):
        parse("--modes", "exclusive")
    monkeypatch.setenv("NODE_NAME", "from-env")
    assert config_from_args(parse()).node == "from-env"


def test_a_bad_or_taken_metrics_bind_is_a_config_error_naming_the_flag():
    probes = SimpleNamespace(healthz=lambda: (True, "ok"), readyz=lambda: (True, "ok"))
    with pytest.raises(ConfigError, match=r"^--metrics-bind 9400: expected HOST:PORT, e\.g\. :9475"):
        probe_server("9400", AgentMetrics(), probes)
    taken = probe_server("127.0.0.1:0", AgentMetrics(), probes)
    try:
        with pytest.raises(ConfigError, match=rf"^--metrics-bind 127\.0\.0\.1:{taken.port}: .*in use"):
            probe_server(f"127.0.0.1:{taken.port}", AgentMetrics(), probes)
    finally:
        taken.server.server_close()


def test_gpufrac_agent_command_is_wired():
    import subprocess
    import sys
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "."}
    out = subprocess.run([sys.executable, "-m", "gpufrac", "agent", "--help"], capture_output=True, text=True,
                         timeout=60, env=env, check=False)
    assert out.returncode == 0 and "--evict-on-violation" in out.stdout
    out = subprocess.run([sys.executable, "-m", "gpufrac", "agent"], capture_output=True, text=True,
                         timeout=60, env=env, check=False)
    assert out.returncode == 2 and "--node is required" in out.stderr
