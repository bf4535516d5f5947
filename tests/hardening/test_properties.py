"""Properties of the two admission decisions on random, hostile AdmissionReviews (in process, many examples).

`make test` runs a few hundred examples in all; `make fuzz` runs the same properties with GPUFRAC_FUZZ_EXAMPLES.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.errors import BadReviewError
from gpufrac.webhook.decide.mutation import canonical_annotations
from gpufrac.webhook.decide.policy import Policy, UserInfo
from gpufrac.webhook.decide.resolve import resolve
from gpufrac.webhook.decide.review import build_response, parse_review
from gpufrac.webhook.decide.rules.catalog.boundaries import boundaries as _boundaries
from gpufrac.webhook.decide.rules.catalog.webhook_output import webhook_output as _webhook_output
from gpufrac.webhook.decide.validation import authorship as _authorship
from testkit import strategies as s

POLICIES = (Policy(), Policy(require_enforcing_node=True, scheduler_groups=frozenset({"system:authenticated"})))
DENIAL_SUBJECTS = ("annotation ", "label ", "container ", "ephemeral container ", "volume ", "pod")
# Where the mutating webhook may write: metadata maps, env and mounts of containers, volumes, node affinity.
PATCH_PATH = re.compile(r"^/(metadata(/annotations|/labels)?(/.*)?|spec/volumes(/.*)?|spec/affinity(/.*)?"
                        r"|spec/(containers|initContainers|ephemeralContainers)/\d+/(env|volumeMounts)(/.*)?)$")
K8S_VERSION = "1.36.0"


def decide(body: Any, decision, policy: Policy) -> admission.Outcome | None:
    """The decision on a body, or None when the body is refused as not a review (BadReviewError)."""
    try:
        request = parse_review(body)
        outcome = decision(request, policy)
    except BadReviewError:
        event(f"{decision.__name__}: bad review (400)")
        return None
    assert isinstance(outcome, admission.Outcome)
    event(f"{decision.__name__}: {'denied' if not outcome.allowed else 'patched' if outcome.patch else 'allowed'}")
    return outcome


def is_valid_pod(obj: Any) -> bool:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError:
        return False
    return True


def check_denials(outcome: admission.Outcome) -> None:
    for violation in outcome.violations:
        text = str(violation)
        assert text.startswith(DENIAL_SUBJECTS), f"denial names no annotation/label/container/volume/pod: {text}"
    if not outcome.allowed:
        assert outcome.message and not outcome.patch


def check_denied_as_validation_denies(denial: admission.Outcome, unmutated: admission.Outcome | None) -> None:
    """The mutating webhook's denial of the scheduler's UPDATE is one validation makes of the same request: every
    problem it names, validation names too (validation may name more: the canonical values the mutation would
    have written are still missing from the unmutated pod)."""
    assert unmutated is not None and not unmutated.allowed, f"denied only by the mutating webhook: {denial.message}"
    missing = {str(v) for v in denial.violations} - {str(v) for v in unmutated.violations}
    assert not missing, f"the mutating webhook names problems validation does not: {missing}"


def respond(outcome: admission.Outcome, uid: str) -> None:
    response = build_response(uid, allowed=outcome.allowed, message=outcome.message, patch=outcome.patch,
                              warnings=outcome.warnings)
    json.dumps(response)  # the wire form is always encodable


@given(body=s.reviews(), policy=st.sampled_from(POLICIES))
@s.examples(150)
def test_decisions_answer_or_refuse_and_never_crash(body, policy):
    original = copy.deepcopy(body)
    for decision in (admission.mutate, admission.validate):
        outcome = decide(copy.deepcopy(original), decision, policy)
        if outcome is None:
            continue
        check_denials(outcome)
        request = parse_review(copy.deepcopy(original))
        respond(outcome, request.uid)
        if request.operation in ("DELETE", "CONNECT") or request.resource != "pods" or request.obj is None:
            assert outcome.allowed and not outcome.patch, "only pod CREATE/UPDATE is judged"
        if request.sub_resource == "exec" or (request.sub_resource == "status" and request.operation != "UPDATE"):
            assert outcome.allowed and not outcome.patch
        if request.sub_resource == "status":
            assert not outcome.patch, "pods/status is judged (its metadata), never patched"
        if decision is admission.mutate and request.operation != "CREATE" and not outcome.allowed:
            # It judges the scheduler's UPDATE whole (issue 47), and denies only for problems validation names too.
            assert policy.is_scheduler(request.user) and not request.sub_resource, \
                "the mutating webhook denies only a CREATE or the scheduler's UPDATE"
            check_denied_as_validation_denies(outcome, decide(copy.deepcopy(original), admission.validate, policy))
        if decision is admission.validate:
            assert not outcome.patch


def _mutated(body: dict[str, Any], policy: Policy) -> tuple[dict[str, Any], admission.Outcome] | None:
    outcome = decide(copy.deepcopy(body), admission.mutate, policy)
    if outcome is None or not outcome.allowed:
        return None
    for op in outcome.patch:
        for path in (op["path"], op.get("from")):
            assert path is None or PATCH_PATH.match(path), f"patch writes outside its area: {op}"
    obj = body["request"]["object"]
    patched = jsonpatch.apply_patch(copy.deepcopy(obj), outcome.patch)  # applies to the object as sent
    return patched, outcome


@given(obj=s.pods(), user=st.sampled_from(["alice", s.BINDER]), policy=st.sampled_from(POLICIES))
@s.examples(150)
def test_an_accepted_create_patches_cleanly_once_and_validation_agrees(obj, user, policy):
    body = s.envelope(obj, user=user)
    result = _mutated(body, policy)
    if result is None:
        return
    patched, outcome = result
    # A valid Pod stays a valid Pod.
    if outcome.patch and is_valid_pod(obj):
        try:
            kubernetes_validate.validate(patched, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"the patched pod is not a valid Pod: {exc}\n{json.dumps(patched)[:3000]}")
    # Idempotent: the API server may call again (reinvocationPolicy IfNeeded); the second call adds nothing.
    again = decide(s.envelope(copy.deepcopy(patched), user=user), admission.mutate, policy)
    assert again is not None and again.allowed, f"a pod the webhook mutated is refused when mutated again: {again}"
    assert again.patch == [], f"mutating twice is not mutating once: {again.patch}"
    assert not again.warnings, again.warnings
    # The validating webhook judges values exactly as the mutating one did (resolve), and it finds the
    # mutation's output intact: it may only deny what mutation does not judge (authorship, boundaries).
    verdict = decide(s.envelope(copy.deepcopy(patched), user=user), admission.validate, policy)
    assert verdict is not None
    fractions = _fractions(patched)
    only_validation = {str(v) for v in _authorship(None, patched, UserInfo(user, ("system:authenticated",)), policy)
                       + _boundaries(patched, fractions, policy)}
    if not fractions.is_fractional:  # left untouched by mutation: our label/annotations written by hand are denied
        only_validation |= {str(v) for v in _webhook_output(patched, fractions)}
    unexpected = [str(v) for v in verdict.violations if str(v) not in only_validation]
    assert not unexpected, f"validate denies a pod mutate accepted, for a rule mutate shares: {unexpected}"


def _fractions(obj: dict[str, Any]):
    return resolve(copy.deepcopy(obj), bound=False)[0]


@given(created=s.pods(), bind=st.dictionaries(st.sampled_from(["app", "sidecar", "worker"]), st.tuples(
    st.sampled_from(["20Gi", "40Gi", "1000M", "0", "1e400", "junk"]), st.sampled_from(["", "40Gi", "80Gi", "1Gi"]),
    st.lists(st.sampled_from(s.DEVICE_IDS[:4]), min_size=1, max_size=2, unique=True)), max_size=2))
@s.examples(100)
def test_the_scheduler_bind_is_mutated_into_a_pod_validation_accepts_or_is_denied(created, bind):
    """CREATE, then the scheduler's bind UPDATE: the mutating webhook, which judges it alone where it fails closed
    (issue 47), either writes canonical values validation accepts or denies it as validation would (the pod never
    runs with values nobody checked)."""
    policy = Policy()
    result = _mutated(s.envelope(created), policy)
    if result is None:
        return
    old, _ = result
    new = copy.deepcopy(old)
    for name, (request, limit, devices) in bind.items():
        new["metadata"]["annotations"][f"nvidia.com/container.{name}.gpu-memory.request"] = request
        if limit:
            new["metadata"]["annotations"][f"nvidia.com/container.{name}.gpu-memory.limit"] = limit
        new["metadata"]["annotations"][f"nvidia.com/container.{name}.gpus.devices"] = ",".join(devices)
    update = s.envelope(new, operation="UPDATE", old=old, user=s.BINDER)
    denial = decide(copy.deepcopy(update), admission.mutate, policy)
    assert denial is not None
    if not denial.allowed:
        check_denied_as_validation_denies(denial, decide(copy.deepcopy(update), admission.validate, policy))
        check_denials(denial)
        return
    mutation = _mutated(update, policy)
    assert mutation is not None
    bound, _ = mutation
    verdict = decide(s.envelope(bound, operation="UPDATE", old=old, user=s.BINDER), admission.validate, policy)
    assert verdict is not None
    assert verdict.allowed, f"the mutating webhook let through a bind validation denies: {verdict.message}"
    fractions, problems = resolve(copy.deepcopy(bound), bound=True)
    assert not problems, "the mutating webhook let through bind values the value rules reject"
    canonical = {k: v for k, v in bound["metadata"]["annotations"].items() if k.startswith("gpufrac.io/")}
    assert canonical == canonical_annotations(fractions), "the pod runs with canonical values that do not match"


@given(body=s.raw_bodies())
@s.examples(100)
def test_any_bytes_are_answered_by_the_app_with_json(body):
    """The Flask app in process: any body gets 200 with a review for the same uid, or a 4xx JSON error."""
    from e2e.hardening.harness import check_http_answer
    client = _client()
    for path in ("/mutate", "/validate"):
        response = client.post(path, data=body, content_type="application/json")
        check_http_answer(body, response.status_code, response.get_data())


_APP = None


def _client():
    global _APP
    if _APP is None:
        from gpufrac.webhook.serve.app import create_app
        _APP = create_app(Policy())
    return _APP.test_client()


# --- over HTTPS, against the real gunicorn process -----------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.hardening.harness import Server
    srv = Server(tmp_path_factory.mktemp("fuzz"), workers=2, threads=4)
    srv.initial_workers = srv.worker_pids()
    yield srv
    srv.stop()


@given(body=s.raw_bodies(), path=st.sampled_from(["/mutate", "/validate"]))
@s.examples(60, fuzz_share=0.2)
def test_https_endpoints_answer_every_body_with_a_review_or_a_json_4xx(server, body, path):
    from e2e.hardening.harness import check_http_answer
    conn = server.connection(timeout=10)  # a hang is a client timeout, reported as a failure
    try:
        status, data = server.post(path, body, conn)
    finally:
        conn.close()
    check_http_answer(body, status, data)


def test_https_fuzzing_left_the_workers_alive_and_the_log_clean(server):
    assert server.popen.poll() is None
    assert server.worker_pids() == server.initial_workers, "a worker died or was replaced during the fuzzing"
    assert server.log_problems() == []
