"""The ValidatingAdmissionPolicies against the real kube-apiserver (docs/admission-policies.md).

One control plane of its own (it stops the webhook and changes the webhook configurations). Every denial case of
e2e/denial_corpus.py is sent three times, as a server-side dry run against pods prepared (in a namespace of this
module's own) while everything was up:

- both engines: the webhook (failurePolicy Fail) and the policies (a pod's CREATE is the mutating webhook's alone);
- the webhook alone (the policies' Bindings deleted): its message;
- the policies alone: the webhook stopped and failurePolicy Ignore, as in an outage of a fail-open install.

Then, with the webhook down and failurePolicy Fail: a running fractional pod's status updates (as the kubelet writes
them) and its deletion succeed, and a new fractional pod is refused with a message naming the webhook.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.cluster import ControlPlane
from e2e.denial_corpus import BIND_VALUES, CORPUS, SETUPS, Case, Target, Users, prepare
from e2e.kubectl import KubectlResult
from e2e.testing import create, example, pod
from e2e.toolkit.wait import wait_until
from e2e.webhook_configurations import POLICY_DENIED, policy_probe

# Three passes over the corpus, four requests at a time: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

_MESSAGE = re.compile(r"(?:denied the request|denied request): (.*)", re.S)
# Where one violation ends and the next begins in a message (each starts with what it is about).
_NEXT = re.compile(r"; (?=annotation |label |pod: |container |ephemeral container |volume |spec\.\S+: )")


@dataclass
class Verdict:
    denied: bool  # refused by admission (or, by="invalid", by the API server's validation of the object)
    by: str  # "webhook", "policy", "invalid", or "" (admitted)
    message: str

    @classmethod
    def of(cls, res: KubectlResult) -> Verdict:
        if res.rc == 0:
            return cls(False, "", "")
        err = res.stderr.strip()
        found = _MESSAGE.search(err)
        message = found[1].strip() if found else err
        by = "policy" if POLICY_DENIED in err else "webhook" if "admission webhook" in err else "invalid"
        return cls(True, by, message)


@pytest.fixture(scope="module")
def cp(own_control_plane: Callable[..., Iterator[ControlPlane]]) -> Iterator[ControlPlane]:
    yield from own_control_plane("policies")


@pytest.fixture(scope="module")
def corpus_ns(cp: ControlPlane, fresh_namespace, request: pytest.FixtureRequest) -> Iterator[str]:
    """The namespace of the module's prepared pods: every case of the three runs reads them, none writes."""
    with fresh_namespace(cp, request.node.nodeid) as name:
        yield name


def _users(cp: ControlPlane, ns: str) -> Users:
    return Users(*(lambda *a, _u=u, **kw: cp.kubectl("-n", ns, *a, user=_u, **kw)
                   for u in ("alice", "binder", "admin")))


def _ok(res: KubectlResult) -> str:
    assert res.rc == 0, res.stderr
    return res.stdout


def _prepare(users: Users, ns: str) -> dict[str, str]:
    """The pods the UPDATE cases edit (with both engines up): setup -> pod name."""
    names = {s: f"corpus-{s}" for s in SETUPS}
    for setup, name in names.items():
        prepare(setup, users, ns, name)
    return names


def _send_all(users: Users, ns: str, names: dict[str, str]) -> dict[str, Verdict]:
    """Every case, as dry runs (they store nothing, so they may run side by side)."""
    def send(case: Case) -> Verdict:
        return Verdict.of(case.send(Target(users, ns, names.get(case.setup, "corpus"))))

    with ThreadPoolExecutor(4) as pool:
        verdicts = pool.map(send, CORPUS)
        return {case.id: verdict for case, verdict in zip(CORPUS, verdicts, strict=True)}


def _webhook_alone(cp: ControlPlane, ns: str) -> None:
    """The webhook configurations as the chart renders them without policies (the validating webhook called on
    CREATE and on pods/status), and the policies' Bindings deleted."""
    cp.policies = False
    cp.apply_webhook_configurations()
    _ok(cp.kubectl("delete", "validatingadmissionpolicybindings", "-l", "app.kubernetes.io/part-of=gpufrac",
                   user="admin"))
    # Until the webhook, not a policy, answers the probe the policies deny.
    admin = functools.partial(cp.kubectl, user="admin")
    wait_until(lambda: POLICY_DENIED not in policy_probe(admin).stderr, 30, "the policies to be unbound", interval=0.5)


@pytest.fixture(scope="module")
def runs(cp: ControlPlane, corpus_ns: str) -> dict[str, dict[str, Verdict]]:
    users = _users(cp, corpus_ns)
    names = _prepare(users, corpus_ns)
    both = _send_all(users, corpus_ns, names)
    _webhook_alone(cp, corpus_ns)
    webhook = _send_all(users, corpus_ns, names)
    cp.policies = True
    cp.apply_webhook_configurations("webhook.failurePolicy=Ignore")
    cp.stop_webhook()
    policies = _send_all(users, corpus_ns, names)
    cp.start_webhook()
    cp.apply_webhook_configurations()
    runs = {"both": both, "webhook": webhook, "policies": policies}
    _write_table(cp.workdir.parent / "admission-policies-table.md", runs)
    return runs


def violations(message: str) -> list[str]:
    return sorted(_NEXT.split(message)) if message else []


def same_text(policy: str, webhook: str) -> str:
    """"yes": the same violations (in any order: several keys breaking one rule come in the API server's map order),
    "no" otherwise."""
    return "yes" if violations(policy) == violations(webhook) else "no"


def policy_message(case: Case, runs: dict[str, dict[str, Verdict]]) -> Verdict:
    """The policies' own answer to a case, alone. A boundary of a fractional CREATE reaches them only unmutated (with
    the webhook up, the mutating webhook judges a CREATE whole), and they refuse it for being unmutated."""
    return runs["policies"][case.id]


def _said(v: Verdict) -> str:
    return {"policy": "denied by a policy", "webhook": "denied by the webhook", "invalid": "refused as invalid",
            "": "**admitted**"}[v.by]


def _write_table(path: Path, runs: dict[str, dict[str, Verdict]]) -> None:
    """The table docs/admission-policies.md shows, from this run."""
    lines = ["| case | both engines | webhook alone | policies alone (webhook down, Ignore) | policy's text = "
             "webhook's | not covered because |", "|---|---|---|---|---|---|"]
    for case in CORPUS:
        b, w, p = (runs[k][case.id] for k in ("both", "webhook", "policies"))
        mine = policy_message(case, runs)
        same = same_text(mine.message, w.message) if mine.by == "policy" else "—"
        if case.unmutated and mine.by == "policy":
            same = "— (refused unmutated)"
        lines.append(f"| `{case.id}` | {_said(b)} | {_said(w)} | {_said(p)} | {same} | {case.webhook_only} |")
    path.write_text("\n".join(lines) + "\n")
    print(f"\n[policies] table written to {path}")


def test_both_engines_deny_every_case(runs: dict[str, dict[str, Verdict]]) -> None:
    admitted = [c.id for c in CORPUS if not runs["both"][c.id].denied]
    assert not admitted, admitted
    for case in CORPUS:
        verdict = runs["both"][case.id]
        for fragment in case.fragments:
            assert fragment in verdict.message, (case.id, fragment, verdict.message)


def test_the_webhook_alone_denies_every_case(runs: dict[str, dict[str, Verdict]]) -> None:
    assert all(runs["webhook"][c.id].by == "webhook" for c in CORPUS), \
        [(c.id, runs["webhook"][c.id]) for c in CORPUS if runs["webhook"][c.id].by != "webhook"]


def test_with_the_webhook_down_and_ignore_the_policies_deny_every_case_they_cover(
        runs: dict[str, dict[str, Verdict]]) -> None:
    covered = [c for c in CORPUS if not c.webhook_only]
    wanted = {c.id: "invalid" if c.invalid_unmutated else "policy" for c in covered}
    missed = [(c.id, runs["policies"][c.id]) for c in covered if runs["policies"][c.id].by != wanted[c.id]]
    assert not missed, f"not denied by a policy though covered: {missed}"
    # With the chart's defaults (failing closed) the mutating webhook judges a CREATE whole: no policy runs on one.
    creates = [(c.id, runs["both"][c.id]) for c in CORPUS
               if c.manifest is not None and runs["both"][c.id].by != "webhook"]
    assert not creates, creates
    uncovered = [c for c in CORPUS if c.webhook_only]
    refused = [c for c in uncovered if runs["policies"][c.id].denied]
    print(f"\n[policies] {len(covered)} cases covered by a policy, {len(uncovered)} not ({len(refused)} of them "
          "refused anyway with the webhook down): " + "; ".join(sorted({c.webhook_only for c in uncovered})))
    assert len(covered) > len(uncovered)


def test_the_policies_say_what_the_webhook_says(runs: dict[str, dict[str, Verdict]]) -> None:
    """For every case a policy covers, the same message text as the webhook's: every violation the webhook lists, and
    no other (one validation per policy reports every rule a pod breaks, as the webhook does)."""
    different = []
    for case in CORPUS:
        if case.webhook_only or case.invalid_unmutated or case.unmutated:
            continue
        policy, webhook = policy_message(case, runs).message, runs["webhook"][case.id].message
        if same_text(policy, webhook) != "yes":
            different.append((case.id, policy, webhook))
    assert not different, "\n".join(f"{i}:\n  policy:  {p}\n  webhook: {w}" for i, p, w in different)


# ---- an outage with failurePolicy Fail ------------------------------------------------------------------------


@pytest.fixture
def ns(cp: ControlPlane, fresh_namespace, request: pytest.FixtureRequest) -> Iterator[str]:
    with fresh_namespace(cp, request.node.nodeid) as name:
        yield name


def test_webhook_down_running_pods_report_status_and_are_deleted_new_ones_refused(cp: ControlPlane, runs: object,
                                                                                  ns: str) -> None:
    users = _users(cp, ns)
    name = "outage-running"
    _ok(create(users.alice, example("notebook-time-slicing.yaml", name, namespace=ns)))
    bind = json.dumps({"metadata": {"annotations": BIND_VALUES}})
    _ok(users.binder("patch", "pod", name, "--type=merge", "-p", bind))
    cp.stop_webhook()  # failurePolicy Fail, as the chart installs it
    try:
        # What the kubelet writes: the status subresource, conditions and phase (as admin: no kubelet here).
        status = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                             "containerStatuses": [{"name": "app", "ready": True, "restartCount": 0, "image": "x",
                                                    "imageID": "", "started": True,
                                                    "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}]}}
        res = users.admin("patch", "pod", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))
        assert res.rc == 0, f"a running pod's status update failed while the webhook is down: {res.stderr}"
        # A status update that touches a fraction annotation is still refused, by the policy.
        res = users.admin("patch", "pod", name, "--subresource=status", "--type=merge", "-p",
                          json.dumps({"metadata": {"annotations": {"gpufrac.io/container.app.compute-mode": "x"}}}))
        assert res.rc != 0 and POLICY_DENIED in res.stderr, res.stderr
        res = create(users.alice, pod("outage-new", {"gpu-fraction": "0.5"}, namespace=ns))
        assert res.rc != 0 and 'failed calling webhook "mutate.gpufrac.io"' in res.stderr, res.stderr
        _ok(users.alice("delete", "pod", name, "--wait=false"))
    finally:
        cp.start_webhook()
