"""The conflict-resolution rule: the case table of the module docstring, and its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.core.conflict_resolution import ConflictMode, Meta, incoming_wins

SEQNO, LWW = ConflictMode.SEQNO, ConflictMode.LWW
BASE = Meta(cas=1000, rev_seqno=5, expiry=0, flags=0)


def _with(meta: Meta, **changes: int | bool) -> Meta:
    fields = {
        "cas": meta.cas, "rev_seqno": meta.rev_seqno, "expiry": meta.expiry,
        "flags": meta.flags, "deleted": meta.deleted, "xattrs": meta.xattrs,
    }  # fmt: skip
    fields.update(changes)
    return Meta(**fields)  # type: ignore[arg-type]


CASES = [
    # (case, mode, incoming, local, incoming wins)
    ("1 no local copy", SEQNO, BASE, None, True),
    ("1 no local copy (lww)", LWW, BASE, None, True),
    ("2 seqno: higher rev wins over higher cas", SEQNO, _with(BASE, rev_seqno=6, cas=1),
     BASE, True),
    ("3 seqno: lower rev loses despite higher cas", SEQNO, _with(BASE, rev_seqno=4, cas=9999),
     BASE, False),
    ("2 seqno: same rev, higher cas", SEQNO, _with(BASE, cas=1001), BASE, True),
    ("2 seqno: same rev/cas, later expiry", SEQNO, _with(BASE, expiry=10), BASE, True),
    ("2 seqno: same rev/cas/expiry, higher flags", SEQNO, _with(BASE, flags=1), BASE, True),
    ("2 lww: higher cas wins over higher rev", LWW, _with(BASE, cas=1001, rev_seqno=1),
     BASE, True),
    ("3 lww: lower cas loses despite higher rev", LWW, _with(BASE, cas=999, rev_seqno=99),
     BASE, False),
    ("2 lww: same cas, higher rev", LWW, _with(BASE, rev_seqno=6), BASE, True),
    ("2 seqno delete: higher rev", SEQNO, _with(BASE, rev_seqno=6, deleted=True), BASE, True),
    ("5 seqno delete: expiry/flags not compared, tie loses", SEQNO,
     _with(BASE, deleted=True), _with(BASE, expiry=0, flags=7), False),
    ("5 delete tie loses", LWW, _with(BASE, deleted=True), BASE, False),
    ("5 identical set (an echo) loses", SEQNO, BASE, BASE, False),
    ("5 identical set (an echo) loses (lww)", LWW, BASE, BASE, False),
    ("4 tie: incoming with xattrs over local without", SEQNO, _with(BASE, xattrs=True),
     BASE, True),
    ("5 tie: both with xattrs", SEQNO, _with(BASE, xattrs=True), _with(BASE, xattrs=True),
     False),
    ("5 tie: local with xattrs, incoming without", SEQNO, BASE, _with(BASE, xattrs=True),
     False),
    ("2 set over a local tombstone with lower rev", SEQNO, _with(BASE, rev_seqno=6),
     _with(BASE, deleted=True), True),
    ("3 set under a local tombstone with higher rev", SEQNO, BASE,
     _with(BASE, rev_seqno=6, deleted=True), False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "mode", "incoming", "local", "wins"), CASES, ids=[c[0] for c in CASES]
)
def test_case_table(
    case: str, mode: ConflictMode, incoming: Meta, local: Meta | None, wins: bool
) -> None:
    assert incoming_wins(mode, incoming, local) is wins


u64 = st.integers(min_value=0, max_value=3)  # small ranges: ties happen often


def metas(deleted: bool) -> st.SearchStrategy[Meta]:
    return st.builds(
        Meta, cas=u64, rev_seqno=u64, expiry=u64, flags=u64, deleted=st.just(deleted),
        xattrs=st.booleans(),
    )  # fmt: skip


@given(st.sampled_from(list(ConflictMode)), st.booleans(), st.data())
def test_of_two_versions_at_most_one_wins_and_distinct_ones_exactly_one(
    mode: ConflictMode, deleted: bool, data: st.DataObject
) -> None:
    a, b = data.draw(metas(deleted)), data.draw(metas(deleted))
    a_wins, b_wins = incoming_wins(mode, a, b), incoming_wins(mode, b, a)
    assert not (a_wins and b_wins)
    fields = ("cas", "rev_seqno") if deleted else ("cas", "rev_seqno", "expiry", "flags")
    if any(getattr(a, f) != getattr(b, f) for f in fields) or (
        a.xattrs != b.xattrs and not deleted
    ):
        assert a_wins != b_wins


@given(st.sampled_from(list(ConflictMode)), st.booleans(), st.data())
def test_an_echo_never_wins(mode: ConflictMode, deleted: bool, data: st.DataObject) -> None:
    meta = data.draw(metas(deleted))
    assert not incoming_wins(mode, meta, meta)


@given(st.sampled_from(list(ConflictMode)), st.data())
def test_the_winner_is_the_same_whichever_side_decides(
    mode: ConflictMode, data: st.DataObject
) -> None:
    """Two clusters each hold one version and receive the other: they keep the same one."""
    a, b = data.draw(metas(False)), data.draw(metas(False))
    kept_by_a_side = b if incoming_wins(mode, b, a) else a
    kept_by_b_side = a if incoming_wins(mode, a, b) else b
    if kept_by_a_side != kept_by_b_side:
        # only when neither wins (a full tie with equal xattr flags): then both are equal
        assert (a.cas, a.rev_seqno, a.expiry, a.flags, a.xattrs) == (
            b.cas, b.rev_seqno, b.expiry, b.flags, b.xattrs,
        )  # fmt: skip
