"""`webhook.defaultMode` (the webhook's --default-mode): on a cluster whose drivers predate r615 only sm-sharing is
enforced, and a fraction that names no mode (time-slicing, KAI's default) would be placed nowhere. With the default
set, the webhook writes the mode on CREATE in KAI's keys, so KAI groups the pod by it and the pod's node affinity
asks for a node that enforces it."""

from __future__ import annotations

import jsonpatch
import pytest

from gpufrac.core.annotations import ComputeMode
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.default_mode import with_default_mode
from gpufrac.webhook.decide.errors import BadReviewError
from gpufrac.webhook.decide.policy import Policy
from testkit.pods import pod
from testkit.reviews import review

SM = ComputeMode.SM_SHARING
OLD_DRIVERS = Policy(require_enforcing_node=True, default_mode=SM)


def mutated(obj: dict, policy: Policy) -> dict:
    outcome = admission.mutate(review(obj), policy)
    assert outcome.allowed, outcome.message
    result: dict = jsonpatch.apply_patch(obj, outcome.patch)
    return result


def affinity(obj: dict) -> list[dict]:
    terms = obj["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [e for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]]


def test_a_fraction_without_a_mode_lands_where_sm_sharing_is_enforced() -> None:
    final = mutated(pod({"gpu-fraction": "0.5"}), OLD_DRIVERS)
    annotations = final["metadata"]["annotations"]
    assert annotations["kai.scheduler/gpu-compute-sharing-mode"] == "sm-sharing"  # what KAI reads
    assert annotations["nvidia.com/container.app.gpu-compute.mode"] == "sm-sharing"
    assert annotations["gpufrac.io/container.app.compute-mode"] == "sm-sharing"
    assert {"key": "gpufrac.io/enforcement.sm-sharing", "operator": "In", "values": ["driver", "mps"]} in affinity(
        final)
    # without the default: time-slicing, which a 580 node does not enforce
    plain = mutated(pod({"gpu-fraction": "0.5"}), Policy(require_enforcing_node=True))
    assert plain["metadata"]["annotations"]["gpufrac.io/container.app.compute-mode"] == "time-slicing"
    assert "kai.scheduler/gpu-compute-sharing-mode" not in plain["metadata"]["annotations"]


def test_per_container_keys_get_the_mode_per_container() -> None:
    final = mutated(pod({"nvidia.com/container.app.gpu-memory.request": "20Gi"}), OLD_DRIVERS)
    annotations = final["metadata"]["annotations"]
    assert annotations["nvidia.com/container.app.gpu-compute.mode"] == "sm-sharing"
    assert "kai.scheduler/gpu-compute-sharing-mode" not in annotations


@pytest.mark.parametrize("written", [{"kai.scheduler/gpu-compute-sharing-mode": "time-slicing"},
                                     {"nvidia.com/container.app.gpu-compute.mode": "time-slicing"}])
def test_a_mode_the_user_wrote_stays(written: dict[str, str]) -> None:
    obj = pod({"gpu-fraction": "0.5", **written} if "kai.scheduler/gpu-compute-sharing-mode" in written else
              {"nvidia.com/container.app.gpu-memory.request": "20Gi", **written})
    assert with_default_mode(obj, SM) is obj
    final = mutated(obj, OLD_DRIVERS)
    assert final["metadata"]["annotations"]["gpufrac.io/container.app.compute-mode"] == "time-slicing"


def test_a_pod_without_a_fraction_is_left_alone() -> None:
    obj = pod({"team": "a"})
    assert with_default_mode(obj, SM) is obj
    assert admission.mutate(review(obj), OLD_DRIVERS).patch == []


@pytest.mark.parametrize("metadata", [-1, "x", [], {"annotations": 7}, {"annotations": {"gpu-fraction": 0.5}}])
def test_a_malformed_pod_is_refused_as_a_bad_review_not_a_crash(metadata: object) -> None:
    """Found by the fuzz: `metadata: -1` under a default mode was an AttributeError (a 500), not a 400."""
    obj = pod({"gpu-fraction": "0.5"})
    obj["metadata"] = metadata
    with pytest.raises(BadReviewError, match=r"object\.metadata"):
        admission.mutate(review(obj), OLD_DRIVERS)
