"""A rule is added in one file: a new module of the catalog, in a copy of the package, and nothing else. The
webhook runs it (the mutating webhook's `resolve` and the validating webhook's `validate_pod`, in its place by rank)
and the policies carry its CEL, with no line of the webhook or of the policies' renderer naming it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Path("gpufrac") / "webhook" / "decide" / "rules" / "catalog"

# The whole rule: its message written once, its check on the values read, its CEL, its place (rank 105 of the value
# phase: after `fractionOrMemory`, 100, before `portionWithoutMemory`, 110).
ADDED = '''
from gpufrac.core import annotations as ann
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope

PROBLEM = "is 1023 MiB, which the rule a test adds refuses"


def check(values: Values) -> list[Violation]:
    text = values.shorthands.get(ann.MEMORY)
    return [annotation(ann.MEMORY, text, PROBLEM)] if text == "1023" else []


RULE = Rule(
    "zzNoOddMemory", "a rule a test adds in one file", Scope.POD, Phase.VALUE, 105, check,
    when(f"{has_ann(ann.MEMORY)} && {a(ann.MEMORY)} == '1023'",
         one(annotation_message(lit(ann.MEMORY), a(ann.MEMORY), lit(PROBLEM)))),
)
'''

# Run in a fresh interpreter on the copy: what the webhook and the renderer find there is all they know.
PROBE = '''
import json
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.policy import Policy, UserInfo
from gpufrac.webhook.decide.resolve import resolve
from gpufrac.webhook.decide.rules import RULES
from gpufrac.webhook.decide.validation import validate_pod
from gpufrac.webhook.render import policies

def pod(annotations):
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": {"containers": [{"name": "app"}]}}

# Also wrong by fractionOrMemory (rank 100) and portionWithoutMemory (110), on either side of the added rule (105).
wrong = pod({"gpu-fraction": "0.5", "gpu-memory": "1023", "nvidia.com/container.app.gpu-memory.request": "1Gi"})
print(json.dumps({
    "module": [r.check.__module__ for r in RULES if r.name == "zzNoOddMemory"],
    "resolve": [str(v) for v in resolve(wrong, bound=False)[1]],
    "validate": [str(v) for v in validate_pod(wrong, None, UserInfo("alice"), Policy())],
    "kept": [str(v) for v in resolve(pod({"gpu-memory": "1024"}), bound=False)[1]],
    "helm": policies.render_helm(),
    "yaml": policies.render_yaml(policies.policy_objects(Policy())),
}))
'''


# A rule of a later phase, the same way: one module, run by `validate_pod` (and not by `resolve`) at rank 285 of the
# fractional phase, between `injection` (280) and `boundaries` (290).
ADDED_LATER = '''
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.cel import lit, one, when
from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.rules.context import PodReview
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope

PROBLEM = "is labelled zz-deny, which the rule a test adds refuses"


def check(review: PodReview) -> list[Violation]:
    labelled = "zz-deny" in podview.labels(review.obj)
    return [Violation("pod", PROBLEM)] if review.fractions.is_fractional and labelled else []


RULE = Rule(
    "zzDenyLabelled", "a later rule a test adds in one file", Scope.POD, Phase.FRACTIONAL, 285, check,
    when("size(variables.fractional) > 0 && 'zz-deny' in variables.labels", one(lit("pod: " + PROBLEM))),
)
'''

LATER_PROBE = '''
import json
from gpufrac.webhook.decide.policy import Policy, UserInfo
from gpufrac.webhook.decide.resolve import resolve
from gpufrac.webhook.decide.validation import validate_pod
from gpufrac.webhook.render import policies

privileged = {"name": "app", "securityContext": {"privileged": True}}
wrong = {"metadata": {"name": "p", "labels": {"zz-deny": ""}, "annotations": {"gpu-memory": "1024"}},
         "spec": {"containers": [privileged]}}
print(json.dumps({
    "resolve": [str(v) for v in resolve(wrong, bound=False)[1]],
    "validate": [str(v) for v in validate_pod(wrong, None, UserInfo("alice"), Policy())],
    "yaml": policies.render_yaml(policies.policy_objects(Policy())),
}))
'''


def _probe(tmp_path: Path, modules: dict[str, str], probe: str) -> dict[str, Any]:
    """`probe`'s answer, run on a copy of the package with `modules` added to its catalog."""
    shutil.copytree(ROOT / "gpufrac", tmp_path / "gpufrac", ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in modules.items():
        (tmp_path / CATALOG / f"{name}.py").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_a_value_rule_added_in_one_file_is_run_by_the_webhook_and_carried_by_the_policies(tmp_path: Path) -> None:
    seen = _probe(tmp_path, {"zz_no_odd_memory": ADDED}, PROBE)
    assert seen["module"] == ["gpufrac.webhook.decide.rules.catalog.zz_no_odd_memory"]  # the copy's, found
    before = "annotation gpu-memory: 1023 cannot be used together with gpu-fraction: ask for a portion or for an " \
             "amount of memory, not both"
    added = "annotation gpu-memory: 1023 is 1023 MiB, which the rule a test adds refuses"
    after = "annotation nvidia.com/container.app.gpu-memory.request: 1Gi cannot be used together with gpu-fraction: " \
            "the scheduler writes absolute memory for portion requests at bind"
    # The mutating webhook's values and the validating webhook's denial, in the rank's order.
    assert seen["resolve"][:3] == [before, added, after]
    assert seen["validate"][:3] == [before, added, after]
    assert seen["kept"] == []
    # The policies: the rule's variable, its CEL and its message, among the pod policy's denials.
    for rendered in (seen["helm"], seen["yaml"]):
        assert "name: zzNoOddMemory" in rendered
        assert "variables.zzNoOddMemory" in rendered
        assert "is 1023 MiB, which the rule a test adds refuses" in rendered
    names = ("fractionOrMemory", "zzNoOddMemory", "portionWithoutMemory")
    places = [seen["yaml"].index(f"variables.{n}") for n in names]
    assert places == sorted(places)


def test_a_later_rule_added_in_one_file_is_run_by_validate_pod_in_its_place(tmp_path: Path) -> None:
    seen = _probe(tmp_path, {"zz_deny_labelled": ADDED_LATER}, LATER_PROBE)
    assert seen["resolve"] == []  # not a value rule
    added = "pod: is labelled zz-deny, which the rule a test adds refuses"
    assert added in seen["validate"]
    at = seen["validate"].index(added)
    assert "lacks what gpufrac injects" in seen["validate"][at - 1]  # injection, 280
    assert "is privileged" in seen["validate"][at + 1]  # boundaries, 290
    assert "variables.zzDenyLabelled" in seen["yaml"]
    places = [seen["yaml"].index(f"variables.{n}") for n in ("injection", "zzDenyLabelled", "boundaries")]
    assert places == sorted(places)


def test_without_the_added_module_nothing_of_it_is_there() -> None:
    """The control: the probe on the package as it is finds no such rule, so the test above sees the one file."""
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["module"] == []
    assert not any("the rule a test adds" in v for v in seen["resolve"] + seen["validate"])
    assert "zzNoOddMemory" not in seen["yaml"]

