"""Every CREATE of the e2e denial corpus (e2e/denial_corpus.py), through the webhook's two decisions in process: the
same pod the e2e tests send to the API server is refused here with the same message, in milliseconds, without a
cluster. A pod the mutating webhook admits (a boundary it leaves to the final object, or a plain pod carrying what only
gpufrac writes) is refused by the validating decision on the pod as mutated."""

from __future__ import annotations

import jsonpatch
import pytest

from e2e.denial_corpus import CORPUS, Case
from gpufrac.webhook.decide import admission
from testkit.admission import POLICY, denial
from testkit.reviews import review

CREATES = [c for c in CORPUS if c.manifest is not None]


def _message(case: Case) -> str:
    assert case.manifest is not None
    mutated = admission.mutate(review(case.manifest), POLICY)
    if not mutated.allowed:
        assert not case.unmutated, f"the mutating webhook refuses what it leaves to the final pod: {mutated.message}"
        return denial(case.manifest)  # and the validating one refuses it too
    final = jsonpatch.apply_patch(case.manifest, mutated.patch)
    validated = admission.validate(review(final), POLICY)
    assert not validated.allowed, "the validating webhook admitted the mutated pod"
    return validated.message


@pytest.mark.parametrize("case", CREATES, ids=[c.id for c in CREATES])
def test_the_webhook_refuses_every_create_of_the_corpus(case: Case) -> None:
    message = _message(case)
    missing = [f for f in case.fragments if f not in message]
    assert not missing, f"the message does not name {missing}: {message}"
    assert not [u for u in case.unsaid if u in message], message


def test_most_of_the_corpus_is_a_create_checked_here() -> None:
    assert len(CREATES) >= 60, len(CREATES)
