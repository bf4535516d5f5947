"""The rule table (gpufrac/webhook/decide/rules/) covers every rule the webhook evaluates, one module per rule: a new
rule function that is in no rule's module fails here, so it either declares its CEL or says why it stays in the
webhook; a rule is added by adding its module, nothing else."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.webhook.decide import fractions, resolve, validation
from gpufrac.webhook.decide.rules import MODULES, RULES, SETTINGS, VARIABLES, Phase, Rule, Scope, catalog, table
from gpufrac.webhook.render import policies

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "gpufrac" / "webhook" / "decide" / "rules" / "catalog"
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


def _sample_values() -> tuple[object, dict[object, object]]:
    pod = {"metadata": {"annotations": {"gpu-fraction": "0.5"}}, "spec": {"containers": [{"name": "app"}]}}
    return resolve.read_values(pod["metadata"]["annotations"], fractions.read_containers(pod), False, False)


def test_every_reader_and_check_of_the_webhook_is_a_rules() -> None:
    """The readers whose violations reach a denial are each some rule's `reads`, and the Python of every module of
    the catalog is its rule's `check`: the webhook runs the rules, it calls no check of its own."""
    _, found = _sample_values()
    assert set(found) == {r.reads for r in RULES if r.reads is not None}
    for name in MODULES:
        module = importlib.import_module(f"{catalog.__name__}.{name}")
        if hasattr(module, "check"):
            assert module.check is module.RULE.check, name
    assert sum(r.check is not None for r in RULES) > 20  # the checks are the rules'
    for composer in (resolve, validation):  # they iterate the table: no rule is imported by name
        assert "rules.catalog" not in inspect.getsource(composer), composer.__name__


def test_the_table_reaches_into_no_private_function() -> None:
    private = [f"{r.name}: {f.__name__}" for r in RULES for f in (r.check, r.reads)
               if f is not None and f.__name__.startswith("_")]
    assert not private


def test_every_rule_is_one_module_holding_its_check_its_cel_and_its_messages() -> None:
    assert len(MODULES) == len(RULES)
    for name in MODULES:
        module = importlib.import_module(f"{catalog.__name__}.{name}")
        rule = module.RULE
        assert isinstance(rule, Rule)
        assert re.sub(r"(?<!^)([A-Z])", r"_\1", rule.name).lower() == name  # the module is named after its rule
        source = inspect.getsource(module)
        assert f'"{rule.name}"' in source
    # No other module of the rules package builds a Rule: the catalog is the one place a rule is written.
    for path in CATALOG.parent.glob("*.py"):
        assert "Rule(" not in path.read_text() or path.name == "rule.py", path


def test_the_order_is_written_once_by_each_rules_phase_and_rank() -> None:
    phases = list(Phase)
    assert [phases.index(r.phase) for r in RULES] == sorted(phases.index(r.phase) for r in RULES)
    for phase in phases:
        ranks = [r.rank for r in RULES if r.phase is phase]
        assert ranks == sorted(ranks)
    assert [r.name for r in RULES if r.phase is Phase.AUTHORSHIP] == ["devicesOnCreate", "immutable"]
    assert [r.name for r in RULES if r.phase is Phase.OUTPUT] == ["webhookOutput"]


@pytest.fixture
def added_rule() -> Iterator[Path]:
    """A rule added the way docs/architecture.md says: one new module in the catalog, no other file touched."""
    path = CATALOG / "zz_added_by_test.py"
    path.write_text('from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope\n\n'
                    'RULE = Rule("zzAddedByTest", "a rule a test adds", Scope.POD, Phase.VALUE, 15,\n'
                    '            lambda values: [], "[\'added\']")\n')
    yield path
    path.unlink(missing_ok=True)
    sys.modules.pop(f"{catalog.__name__}.zz_added_by_test", None)
    importlib.reload(table)


def test_adding_a_rule_touches_one_file(added_rule: Path) -> None:
    fresh = importlib.reload(table)
    names = [r.name for r in fresh.RULES]
    assert "zz_added_by_test" in fresh.MODULES
    # Rank 15 of the value phase: after malformedKeys (10), before unknownContainers (20).
    assert names[:3] == ["malformedKeys", "zzAddedByTest", "unknownContainers"]


def test_a_module_without_a_rule_or_two_rules_in_one_place_are_refused() -> None:
    with pytest.raises(ValueError, match="share a phase and rank"):
        table._ordered([RULES[0], RULES[0]])
    with pytest.raises(TypeError, match="holds no RULE"):
        table._rule_of("__init__")


def test_a_rule_declares_its_cel_or_why_not() -> None:
    with pytest.raises(ValueError, match="give its CEL"):
        Rule("x", "x", Scope.POD, Phase.VALUE, 1, None, reads=fractions.read_mode)
    with pytest.raises(ValueError, match="give its check"):
        Rule("x", "x", Scope.POD, Phase.VALUE, 1, None, "[]")
    for rule in RULES:
        assert rule.cel or rule.webhook_only, rule.name


def test_names_are_cel_identifiers_and_unique() -> None:
    names = [r.name for r in RULES] + [n for n, _ in VARIABLES] + list(SETTINGS)
    assert len(names) == len(set(names))
    assert all(_IDENTIFIER.fullmatch(n) for n in names), names


def test_every_variable_a_rule_uses_is_declared() -> None:
    declared = {n for n, _ in VARIABLES} | set(SETTINGS) | {r.name for r in RULES}
    for text in [e for _, e in VARIABLES] + [r.cel or "" for r in RULES]:
        assert set(re.findall(r"variables\.([A-Za-z]\w*)", text)) <= declared


def test_architecture_doc_lists_which_rule_runs_where() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert policies.rule_table_markdown() in doc, ("docs/architecture.md's table is not the rule table's; paste "
                                                   "`gpufrac policies --format docs` into it")


def _pod(annotations: dict[str, str], names: list[str]) -> dict[str, object]:
    return {"metadata": {"name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": n, "image": "x"} for n in names]}}


def test_the_run_keeps_the_webhooks_order_where_readers_and_checks_interleave() -> None:
    """A reader's violations stand where the first of its rules does: the container values (read, rank 160) after
    the portion limit's container (a check, rank 155), as the webhook listed them before the rules ran by rank."""
    pod = _pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.7",
                "nvidia.com/container.b.gpu-compute.mode": "bogus"}, ["a", "b"])
    _, violations = resolve.resolve(pod, bound=False)
    assert [str(v) for v in violations] == [
        "annotation gpu-fraction.limit: 0.7 applies to container b, which the nvidia.com/container.b.* annotations "
        "name, but KAI reads a portion limit as the first container's (a) unless gpu-fraction-container-name says "
        "otherwise: set gpu-fraction-container-name to b",
        "annotation nvidia.com/container.b.gpu-compute.mode: bogus must be time-slicing or sm-sharing"]


def test_the_rules_judged_by_fraction_list_each_fractions_messages_together() -> None:
    long_a, long_b = "a" * 40, "b" * 40
    pod = _pod({f"nvidia.com/container.{n}.{f}": v for n in (long_a, long_b)
                for f, v in (("gpu-memory.request", "1Gi"), ("gpus.devices", "GPU-1,GPU-2"))}, [long_a, long_b])
    _, violations = resolve.resolve(pod, bound=False, allow_multiple=True)
    shown = [str(v) for v in violations]
    assert [s.split(":")[0] for s in shown] == [
        f"annotation nvidia.com/container.{long_a}.gpus.devices", f"container {long_a}",
        f"annotation nvidia.com/container.{long_b}.gpus.devices", f"container {long_b}"]
    assert "lists 2 devices" in shown[0] and "has a name longer than 30 characters" in shown[1]
