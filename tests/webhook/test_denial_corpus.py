"""Every CREATE of the e2e denial corpus (e2e/denial_corpus.py), through the mutating webhook's decision in process:
the same pod the e2e tests send to the API server is refused here with the same message, in milliseconds, without a
cluster. The mutating webhook judges a CREATE whole: what it would admit as values (a boundary, a plain pod carrying
what only gpufrac writes) it refuses with every validating rule run on the pod as mutated, so that where it fails
closed neither the validating webhook nor the policies look at a CREATE; the validating decision, which still runs
there where the mutating webhook fails open, says the same of the pod as mutated."""

from __future__ import annotations

import pytest

from e2e.denial_corpus import CORPUS, Case
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.mutation import mutate_create
from gpufrac.webhook.decide.resolve import resolve
from testkit.admission import POLICY
from testkit.reviews import review

CREATES = [c for c in CORPUS if c.manifest is not None]


def _message(case: Case) -> str:
    assert case.manifest is not None
    mutated = admission.mutate(review(case.manifest), POLICY)
    assert not mutated.allowed, "the mutating webhook admitted it"
    if case.unmutated:  # a boundary: the validating decision says the same of the pod as mutated
        fractions, _ = resolve(case.manifest, bound=False)
        final = mutate_create(case.manifest, fractions, POLICY).obj
        assert admission.validate(review(final), POLICY).message == mutated.message
    return mutated.message


@pytest.mark.parametrize("case", CREATES, ids=[c.id for c in CREATES])
def test_the_webhook_refuses_every_create_of_the_corpus(case: Case) -> None:
    message = _message(case)
    missing = [f for f in case.fragments if f not in message]
    assert not missing, f"the message does not name {missing}: {message}"
    assert not [u for u in case.unsaid if u in message], message


def test_most_of_the_corpus_is_a_create_checked_here() -> None:
    assert len(CREATES) >= 60, len(CREATES)
