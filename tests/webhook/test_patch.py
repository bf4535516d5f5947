"""The targeted patch: applying it gives exactly the mutated pod, and untouched parts cost nothing."""

from __future__ import annotations

import copy

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.webhook.decide.patch import diff, working_copy
from testkit.pods import INFERENCE, pod

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(before=st.dictionaries(st.text(max_size=5), json_values, max_size=5),
       after=st.dictionaries(st.text(max_size=5), json_values, max_size=5))
def test_applying_the_diff_gives_the_target(before, after):
    original = copy.deepcopy(before)
    assert jsonpatch.apply_patch(before, diff(before, after)) == after
    assert before == original  # diff reads, never writes


def test_keys_with_slashes_and_tildes_are_escaped():
    before = {"metadata": {"annotations": {"a/b~c": "1"}}}
    after = {"metadata": {"annotations": {"a/b~c": "2", "gpufrac.io/x": "y"}}}
    ops = diff(before, after)
    assert {"op": "replace", "path": "/metadata/annotations/a~1b~0c", "value": "2"} in ops
    assert jsonpatch.apply_patch(before, ops) == after


def test_the_working_copy_leaves_the_request_alone_and_shares_the_rest():
    obj = pod(INFERENCE, "app", "sidecar")
    obj["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    original = copy.deepcopy(obj)
    work = working_copy(obj)
    work["metadata"]["annotations"]["x"] = "y"
    work["spec"]["containers"][0]["env"].append({"name": "B", "value": "2"})
    work["spec"]["volumes"] = [{"name": "v"}]
    assert obj == original
    assert work["spec"]["containers"][1]["image"] is obj["spec"]["containers"][1]["image"]
    ops = diff(obj, work)
    assert {op["path"] for op in ops} == {"/metadata/annotations/x", "/spec/containers/0/env", "/spec/volumes"}
