"""The escape matrix's rows 5 and 9 for real: containerd 2 from the tools cache (CRI, NRI and CDI on), crictl making
the pods as a kubelet would, and the agent's own NRI plugin (NriPlugin, the wire session, decide, nri_sweep).

Row 5: containerd tells the plugin each container's user, and a fraction of another UID than the one a single-user
MPS daemon serves is refused at creation. Row 9: a fraction
created while no plugin is registered goes through unchanged (NRI fails open); the plugin, back, finds it at
Synchronize and stops it (its first process killed: containerd then reports it exited), or, created but not started,
refuses its start (containerd then fails it). A fraction created through the plugin carries its mark in its OCI spec
and is left running across a restart of the plugin."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cri_harness import crictl, registered_plugin, started_cri_node
from e2e.node import APP_IMAGE, GPU_UUIDS
from e2e.toolkit.cri_node import CriNode
from e2e.toolkit.wait import wait_until
from gpufrac.agent.nri.decide.creation import MARK
from testkit.agent import canonical_annotations, container, injected_env
from testkit.nri_plugin import RecordingSink

pytestmark = pytest.mark.e2e


def crictl_binary() -> str:
    found = crictl()
    assert found is not None
    return found


@pytest.fixture
def node() -> Iterator[CriNode]:
    with started_cri_node("sw", pytest.skip) as started:
        yield started


class Pods:
    """Pods made with crictl, each a fraction of GPU 1 with the env the webhook's fieldRefs resolve to."""

    def __init__(self, cri: CriNode, workdir: Path) -> None:
        self.cri = cri
        self.workdir = workdir

    def call(self, *argv: str) -> str:
        done = self.run(*argv)
        assert done.returncode == 0, f"crictl {argv[0]}: {done.stderr.strip()[-400:]}"
        return done.stdout.strip()

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([crictl_binary(), "--runtime-endpoint", f"unix://{self.cri.socket}", *argv],
                              capture_output=True, text=True, timeout=120, check=False)

    def fraction(self, name: str, uid: int | None = None) -> str:
        """The fraction's pod and running container (as `uid`, where given); its container's ID."""
        sandbox, config = self.configs(name, uid)
        container_id = self.call("create", self.call("runp", str(sandbox)), str(config), str(sandbox))
        self.call("start", container_id)
        return container_id

    def plain(self, name: str, env: dict[str, str], annotations: dict[str, str] | None = None) -> str:
        """A pod that is no fraction (with `annotations`), its running container with `env`; the container's ID."""
        sandbox, config = self.configs(name, None, fraction=False, env=env, annotations=annotations)
        container_id = self.call("create", self.call("runp", str(sandbox)), str(config), str(sandbox))
        self.call("start", container_id)
        return container_id

    def env(self, container_id: str) -> list[str]:
        return list(json.loads(self.call("inspect", container_id))["info"]["runtimeSpec"]["process"]["env"])

    def configs(self, name: str, uid: int | None, *, fraction: bool = True, env: dict[str, str] | None = None,
                annotations: dict[str, str] | None = None) -> tuple[Path, Path]:
        annotations = {**(canonical_annotations("app", request_mib=1024, limit_mib=2048, devices=[GPU_UUIDS[1]])
                          if fraction else {}), **(annotations or {})}
        if env is None:
            env = {k: v for k, v in injected_env(container("app", request_mib=1024, limit_mib=2048,
                                                           devices=(GPU_UUIDS[1],))).items() if k != "PATH"}
        sandbox = self.workdir / f"{name}-pod.json"
        sandbox.write_text(json.dumps({
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "attempt": 0},
            "annotations": annotations, "log_directory": str(self.workdir / f"{name}-logs"),
            "linux": {"security_context": {"namespace_options": {"network": 2}}}}))
        config = self.workdir / f"{name}-app.json"
        config.write_text(json.dumps({
            "metadata": {"name": "app"}, "image": {"image": APP_IMAGE}, "command": ["sleep", "3600"],
            "envs": [{"key": k, "value": v} for k, v in env.items()], "log_path": "app.log",
            "linux": {"security_context": {"run_as_user": {"value": uid}} if uid is not None else {}}}))
        return sandbox, config

    def state(self, container_id: str) -> str:
        return str(json.loads(self.call("inspect", container_id))["status"]["state"])

    def annotations(self, container_id: str) -> dict[str, str]:
        """The container's OCI spec annotations, where an NRI adjustment's land."""
        spec = json.loads(self.call("inspect", container_id))["info"]["runtimeSpec"]
        return dict(spec.get("annotations") or {})


TOLERATE = "gpufrac.io/tolerate-missing-nri-plugin"  # the chart's nri.tolerateMissingPluginsAnnotation


def test_with_gpufrac_required_containerd_refuses_creations_while_the_plugin_is_away(tmp_path: Path) -> None:
    """docs/install.md's `required_plugins = ["gpufrac"]` (containerd 2.2+) on containerd 2.4.2: while the plugin is
    away a container is refused, but in a pod with the tolerate annotation (the agent's and the MPS daemons'); with
    the plugin registered it is created, through the plugin."""
    with started_cri_node("rq", pytest.skip, nri_required_plugins=("gpufrac",),
                          nri_tolerate_annotation=TOLERATE) as node:
        pods = Pods(node, tmp_path)
        sandbox, config = pods.configs("refused-while-away", None)
        refused = pods.run("create", pods.call("runp", str(sandbox)), str(config), str(sandbox))
        # crictl quotes containerd's error, its quotes escaped
        said = refused.stderr.replace('\\"', '"')
        assert refused.returncode != 0 and 'required plugin "gpufrac" not present' in said, refused.stderr
        tolerated = pods.plain("tolerated-while-away", {"NVIDIA_VISIBLE_DEVICES": "void"},
                               annotations={TOLERATE: "true"})
        assert pods.state(tolerated) == "CONTAINER_RUNNING"
        with registered_plugin(node, RecordingSink(), "gpufrac"):
            served = pods.fraction("made-through-the-plugin")
            assert pods.annotations(served)[MARK] == f"time-slicing k8s.device-plugin.nvidia.com/gpu={GPU_UUIDS[1]}"


def test_containerd_stops_a_fraction_created_while_the_plugin_was_away_and_keeps_the_ones_it_served(
        node: CriNode, tmp_path: Path) -> None:
    pods = Pods(node, tmp_path)
    lock = tmp_path / "nri.lock"
    lock.write_text(f"4242\n{time.time():.3f}\n")  # a plugin was registered here until now, then went away
    away = pods.fraction("made-while-away")  # no plugin: containerd creates it unchanged
    assert pods.state(away) == "CONTAINER_RUNNING" and MARK not in pods.annotations(away)

    sink = RecordingSink()
    with registered_plugin(node, sink, "sweep-test", lock):  # back: Synchronize lists it, the plugin stops it
        wait_until(lambda: pods.state(away) == "CONTAINER_EXITED", 60, "the unserved fraction stopped", interval=0.2)
        [found] = sink.unserved
        assert found.container.id == away and "while the gpufrac NRI plugin was away" in found.message
        served = pods.fraction("made-through-the-plugin")  # with the plugin: adjusted, and marked so
        assert pods.annotations(served)[MARK] == f"time-slicing k8s.device-plugin.nvidia.com/gpu={GPU_UUIDS[1]}"
    sink = RecordingSink()
    with registered_plugin(node, sink, "sweep-test", lock):  # a restart: the served fraction is left alone
        time.sleep(2)
        assert sink.unserved == [] and pods.state(served) == "CONTAINER_RUNNING"


def test_containerd_fails_the_start_of_a_fraction_created_while_the_plugin_was_away(node: CriNode,
                                                                                  tmp_path: Path) -> None:
    """Created (not started) while no plugin was registered: the sweep has no process to stop, so the plugin refuses
    its start, and containerd fails it; started after the plugin is back, a fraction it served runs."""
    pods = Pods(node, tmp_path)
    lock = tmp_path / "nri.lock"
    lock.write_text(f"4242\n{time.time():.3f}\n")  # a plugin was registered here until now, then went away
    sandbox, config = pods.configs("created-while-away", None)
    away = pods.call("create", pods.call("runp", str(sandbox)), str(config), str(sandbox))
    assert pods.state(away) == "CONTAINER_CREATED"
    sink = RecordingSink()
    with registered_plugin(node, sink, "start-test", lock):
        started = pods.run("start", away)
        assert started.returncode != 0 and "while the gpufrac NRI plugin was away" in started.stderr, started.stderr
        assert pods.state(away) != "CONTAINER_RUNNING"
        [found] = sink.unserved
        assert found.container.id == away and "refused its start" in found.message
        served = pods.fraction("created-through-the-plugin")
        assert pods.state(served) == "CONTAINER_RUNNING"


def test_a_fraction_of_another_uid_than_the_single_user_daemon_serves_is_refused_at_creation(
        node: CriNode, tmp_path: Path) -> None:
    pods = Pods(node, tmp_path)
    sink = RecordingSink()
    with registered_plugin(node, sink, "user-test"):  # both modes' daemons single-user here (no MPS v3)
        first = pods.fraction("as-1000", uid=1000)
        assert pods.state(first) == "CONTAINER_RUNNING"
        sandbox, config = pods.configs("as-2000", uid=2000)
        refused = pods.run("create", pods.call("runp", str(sandbox)), str(config), str(sandbox))
        assert refused.returncode != 0
        assert ("container app of pod team-a/as-2000 runs as UID 2000, but this node's time-slicing MPS daemon serves "
                "one user at a time and serves UID 1000 (container app of pod team-a/as-1000)") in refused.stderr
        assert pods.fraction("also-1000", uid=1000)  # its own UID is served


def test_containerd_stops_a_plain_container_that_asked_for_a_gpu_while_the_plugin_was_away(
        node: CriNode, tmp_path: Path) -> None:
    """Issue 43, the away window for plain pods: a container that is no fraction, created while no plugin was
    registered with the CUDA image's NVIDIA_VISIBLE_DEVICES=all (which NVIDIA's runtime turns into every GPU), is
    stopped when the plugin is back; one that asked for no GPU (the image's `all` voided in its spec), and one the
    plugin voided, keep running."""
    pods = Pods(node, tmp_path)
    lock = tmp_path / "nri.lock"
    lock.write_text(f"4242\n{time.time():.3f}\n")  # a plugin was registered here until now, then went away
    greedy = pods.plain("greedy-while-away", {})
    modest = pods.plain("modest-while-away", {"NVIDIA_VISIBLE_DEVICES": "void"})

    sink = RecordingSink()
    with registered_plugin(node, sink, "sweep-test", lock):
        wait_until(lambda: pods.state(greedy) == "CONTAINER_EXITED", 60, "the greedy container stopped",
                   interval=0.2)
        [found] = sink.unserved
        assert found.container.id == greedy and "is no GPU fraction and its env asks for a GPU" in found.message
        assert pods.state(modest) == "CONTAINER_RUNNING"
        voided = pods.plain("greedy-through-the-plugin", {})
        assert "NVIDIA_VISIBLE_DEVICES=void" in pods.env(voided)
    sink = RecordingSink()
    with registered_plugin(node, sink, "sweep-test", lock):  # a restart: what the plugin voided is left alone
        time.sleep(2)
        assert sink.unserved == [] and pods.state(voided) == "CONTAINER_RUNNING"
