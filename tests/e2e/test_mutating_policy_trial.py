"""Can a MutatingAdmissionPolicy carry the webhook's translation of the seed pods? (docs/admission-policies.md)

Each example (and a few seed variants) is created as a server-side dry run twice on one control plane: mutated by
the gpufrac webhook (its configurations, no policies), then by the trial policy alone (tests/e2e/
mutating_policy_trial.py; the webhook configurations deleted). The pods are compared byte for byte (as JSON, without
what the API server makes up per request). The differences found are the report's; this test fails when they change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from e2e.cluster import ControlPlane
from e2e.mutating_policy_trial import NAME, objects
from e2e.testing import pod
from e2e.toolkit.wait import wait_until
from gpufrac.webhook.decide.policy import Policy
from testkit.pods import EXAMPLES, IMAGE

pytestmark = pytest.mark.e2e

SEEDS: dict[str, dict] = {
    **{p.stem: yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml"))
       if not p.name.startswith("wrong-")},
    "gpu-memory-shorthand": pod("seed", {"gpu-memory": "20480", "gpu-memory.limit": "30Gi"}),
    "portion-with-sidecar": pod("seed", {"gpu-fraction": "0.25"},
                                [{"name": "app", "image": IMAGE}, {"name": "side", "image": "busybox:1.37"}]),
    "init-container-target": pod("seed", {"gpu-fraction": "0.5", "gpu-fraction-container-name": "setup"},
                                 [{"name": "main", "image": "busybox:1.37"}],
                                 initContainers=[{"name": "setup", "image": IMAGE}]),
}


@pytest.fixture(scope="module")
def cp(own_control_plane: Callable[..., Iterator[ControlPlane]]) -> Iterator[ControlPlane]:
    yield from own_control_plane("map", policies=False)  # MutatingAdmissionPolicy: GA in 1.36


@pytest.fixture
def ns(cp: ControlPlane, fresh_namespace, request: pytest.FixtureRequest) -> Iterator[str]:
    with fresh_namespace(cp, request.node.nodeid) as name:
        yield name


def _created(cp: ControlPlane, ns: str, manifest: dict) -> dict:
    res = _try(cp, ns, manifest)
    assert res.rc == 0, res.stderr
    obj = json.loads(res.stdout)
    for volatile in ("uid", "creationTimestamp", "managedFields", "resourceVersion", "generation"):
        obj["metadata"].pop(volatile, None)
    return obj


def test_the_trial_policy_against_the_webhook(cp: ControlPlane, ns: str) -> None:
    """What the run found (docs/admission-policies.md): the API server accepts the policy, but refuses to apply it to
    any fractional pod, because an ApplyConfiguration may not set an env entry's fieldRef (an atomic struct): the
    limits' env cannot be carried this way. The webhook's pods are kept beside it for the report."""
    by_webhook = {name: _created(cp, ns, m) for name, m in SEEDS.items()}
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        assert cp.kubectl("delete", kind, "--all", user="admin").rc == 0
    manifest = "---\n".join(yaml.safe_dump(o, sort_keys=False, width=1 << 16) for o in objects(Policy()))
    (cp.workdir.parent / "mutating-policy-trial.yaml").write_text(manifest)
    res = cp.kubectl("apply", "-f", "-", user="admin", input=manifest)
    assert res.rc == 0, res.stderr

    def refused() -> bool:
        return "may not mutate atomic" in _try(cp, ns, SEEDS["notebook-time-slicing"]).stderr

    wait_until(refused, 30, "the trial policy to be applied", interval=0.5)  # it is loaded from an informer
    lines = []
    for name, manifest_ in SEEDS.items():
        res = _try(cp, ns, manifest_)
        assert res.rc != 0 and "may not mutate atomic arrays, maps or structs" in res.stderr, (name, res.stderr)
        assert ".valueFrom.fieldRef" in res.stderr, (name, res.stderr)
        lines.append(f"- {name}: refused: {res.stderr.strip()[:400]}\n  webhook's pod: {json.dumps(by_webhook[name])}")
    out = cp.workdir.parent / "mutating-policy-trial.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"\n[map] {out}")


def _try(cp: ControlPlane, ns: str, manifest: dict):
    manifest = json.loads(json.dumps(manifest))
    manifest["metadata"]["name"] = "seed"
    manifest["metadata"]["namespace"] = ns
    return cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", user="alice", input=json.dumps(manifest))


def test_the_report_shows_the_objects_tried() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "admission-policies.md").read_text()
    assert NAME in doc and "MutatingAdmissionPolicy" in doc
