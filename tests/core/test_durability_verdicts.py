"""Client durability verdicts (core/durability.py): the table of the module docstring."""

from __future__ import annotations

import pytest

from dcpkv.core.durability import (
    DurabilityImpossibleError,
    MutationToken,
    Observation,
    Verdict,
    check_possible,
    judge,
)

TOKEN = MutationToken(vbucket=3, vbucket_uuid=77, seqno=10)
A, R = True, False  # is the observed node the active?


@pytest.mark.parametrize(
    ("observations", "persist_to", "replicate_to", "verdict"),
    [
        ([Observation(A, 9, 10)], 0, 0, Verdict.MET),  # nothing asked: acknowledged is enough
        ([Observation(A, 9, 10)], 1, 0, Verdict.PENDING),  # not persisted yet
        ([Observation(A, 10, 10)], 1, 0, Verdict.MET),
        ([Observation(A, 10, 10), Observation(R, 0, 9)], 0, 1, Verdict.PENDING),
        ([Observation(A, 10, 10), Observation(R, 0, 10)], 0, 1, Verdict.MET),  # received
        ([Observation(A, 10, 10), Observation(R, 0, 10)], 2, 1, Verdict.PENDING),  # ..not on disk
        ([Observation(A, 10, 10), Observation(R, 12, 12)], 2, 1, Verdict.MET),
        ([Observation(A, 0, 10), Observation(R, 10, 10)], 1, 0, Verdict.MET),  # any node persists
        # the active's history no longer holds the token's branch
        ([Observation(A, known=False), Observation(R, 10, 10)], 0, 1, Verdict.LOST),
        # failed over after the write: the new branch began above it, the write survived
        ([Observation(A, 12, 12, branch_end=10)], 1, 0, Verdict.MET),
        # failed over before the replica had it: the new branch began below it
        ([Observation(A, 12, 12, branch_end=9)], 1, 0, Verdict.LOST),
        ([Observation(A, 12, 12), Observation(R, 12, 12, branch_end=4)], 0, 0, Verdict.LOST),
    ],
)
def test_durability_verdicts(
    observations: list[Observation], persist_to: int, replicate_to: int, verdict: Verdict
) -> None:
    assert judge(TOKEN, observations, persist_to, replicate_to) is verdict


@pytest.mark.parametrize(
    ("persist_to", "replicate_to", "replicas", "possible"),
    [(1, 1, 1, True), (2, 1, 1, True), (3, 1, 1, False), (0, 2, 1, False), (0, 0, 0, True),
     (1, 0, 0, True), (-1, 0, 3, False), (4, 3, 3, True), (0, 4, 4, False)],
)  # fmt: skip
def test_impossible_requirements_are_refused_before_polling(
    persist_to: int, replicate_to: int, replicas: int, possible: bool
) -> None:
    if possible:
        check_possible(persist_to, replicate_to, replicas)
    else:
        with pytest.raises(DurabilityImpossibleError):
            check_possible(persist_to, replicate_to, replicas)
