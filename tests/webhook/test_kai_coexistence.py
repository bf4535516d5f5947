"""gpufrac beside KAI's admission: for every shorthand pod of the tests (builders.SHORTHAND_PODS and the examples),
the per-container annotations gpufrac writes are the strings KAI's translation writes (testkit/kai_oracle.py,
modeled from KAI's source), so KAI's admission, installed too, has nothing to change and nothing to deny, in
either order. Besides these cases, every pod the webhook tests admit through builders.allowed/created (the default
policy) is checked the same way: KAI's admission after gpufrac's finds nothing to do."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpufrac.core.annotations import SHORTHAND_KEYS
from gpufrac.webhook.decide import workloads
from testkit.admission import SHORTHAND_PODS, created
from testkit.kai_oracle import KaiDeniedError, kai_mutate, mebibytes_string
from testkit.pods import EXAMPLES, pod


def _example_pods() -> list[tuple[str, dict[str, str], tuple[str, ...]]]:
    """The pods and pod templates under examples/ written with shorthands, as a user writes them: not the ones
    wrong on purpose, nor pods as stored after CREATE."""
    found = []
    for path in sorted(Path(EXAMPLES).rglob("*.yaml")):
        if path.name.startswith("wrong-"):
            continue
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if not isinstance(doc, dict):
                continue
            workload = workloads.BY_KIND.get(doc.get("kind", ""))
            obj = workloads.pod_template(doc, workload) if workload else doc
            annotations = (obj or {}).get("metadata", {}).get("annotations") or {}
            admitted = any(k.startswith("gpufrac.io/") for k in annotations)  # a stored pod (examples/bind)
            if any(k in SHORTHAND_KEYS for k in annotations) and not admitted:
                names = tuple(c["name"] for c in obj["spec"]["containers"])
                found.append((f"{path.name}#{index}", dict(annotations), names))
    return found


CASES = SHORTHAND_PODS + _example_pods()


def test_the_cases_cover_every_translation():
    keys = {k for _, annotations, _ in CASES for k in annotations}
    assert {"gpu-memory", "gpu-memory.limit", "gpu-fraction.limit", "gpu-fraction-container-name"} <= keys
    assert len(_example_pods()) >= 2


@pytest.mark.parametrize(("annotations", "containers"), [(a, c) for _, a, c in CASES], ids=[i for i, _, _ in CASES])
def test_gpufrac_writes_what_kai_writes(annotations, containers):
    ours = created(pod(annotations, *containers))["metadata"]["annotations"]
    kai = kai_mutate(annotations, list(containers))
    for key, value in kai.items():
        assert ours.get(key) == value, f"{key}: gpufrac wrote {ours.get(key)!r}, KAI writes {value!r}"
    # KAI's admission after gpufrac's: nothing left to write, no conflict to deny.
    user_visible = {k: v for k, v in ours.items() if not k.startswith("gpufrac.io/")}
    assert kai_mutate(user_visible, list(containers)) == user_visible
    # And before: gpufrac admits what KAI wrote and ends in the same place.
    assert created(pod(kai, *containers))["metadata"]["annotations"] == ours


def test_the_oracle_is_kais_not_gpufracs():
    """The oracle's own readings, checked against the values KAI's tests and docs give."""
    assert [mebibytes_string(n) for n in (2048, 2000, 1024, 1536, 1048576)] == ["2Gi", "2000Mi", "1Gi", "1536Mi",
                                                                                "1Ti"]
    with pytest.raises(KaiDeniedError, match="does not match container name helper"):
        kai_mutate({"gpu-fraction-container-name": "main", "nvidia.com/container.helper.gpu-memory.request": "1Gi"},
                   ["main", "helper"])
    with pytest.raises(KaiDeniedError, match="conflicts with"):
        kai_mutate({"gpu-memory": "2048", "nvidia.com/container.main.gpu-memory.request": "2048Mi"}, ["main"])
