"""XDCR pipeline decisions: filters, batches, the optimistic threshold, the requests."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.client.events import Deletion, Expiration, Mutation
from dcpkv.client.offsets import VbucketOffset
from dcpkv.cluster.xdcr.pipeline import (
    Batcher,
    Change,
    ChangeFilter,
    needs_get_meta,
    would_win,
    write_frame,
    write_options,
    write_request,
)
from dcpkv.core.conflict_resolution import ConflictMode
from dcpkv.protocol import kv
from dcpkv.protocol.kv import WithMetaOption

AT = VbucketOffset()


def mutation(
    key: bytes, value: bytes = b"v", *, rev: int = 1, cas: int = 10, vb: int = 0
) -> Mutation:
    return Mutation(vb, key, value, 1, rev, 0, 0, cas, 1, AT)


def test_filter() -> None:
    only_users = ChangeFilter(key_regex=r"^user:")
    assert only_users.passes(mutation(b"user:1"))
    assert not only_users.passes(mutation(b"order:1"))
    no_deletes = ChangeFilter(skip_deletions=True)
    assert not no_deletes.passes(Deletion(0, b"k", 2, 2, 2, AT))
    assert no_deletes.passes(Expiration(0, b"k", 2, 2, 2, AT))
    assert not ChangeFilter(skip_expirations=True).passes(Expiration(0, b"k", 2, 2, 2, AT))
    with pytest.raises(ValueError, match="filter expression"):
        ChangeFilter(key_regex="(")


def test_batches_fill_by_items_or_bytes_and_keep_a_keys_newest_change() -> None:
    b = Batcher(max_items=3, max_bytes=100)
    assert b.add(mutation(b"a")) is None
    assert b.add(mutation(b"a", rev=2)) is None  # replaces the older one
    assert b.add(mutation(b"b")) is None
    full = b.add(mutation(b"c"))
    assert full is not None
    assert [(c.key, c.rev_seqno) for c in full] == [(b"a", 2), (b"b", 1), (b"c", 1)]
    assert b.deduplicated == 1 and len(b) == 0
    assert b.add(mutation(b"big", b"x" * 200)) is not None  # over the byte bound alone
    assert b.take() == []


def test_optimistic_threshold_and_source_side_conflict_check() -> None:
    small, large = mutation(b"k", b"x" * 256), mutation(b"k", b"x" * 257, rev=5, cas=50)
    assert not needs_get_meta(small) and needs_get_meta(large)
    assert not needs_get_meta(Deletion(0, b"k", 2, 2, 2, AT))
    newer_there = kv.GetMetaResponse(cas=60, rev_seqno=6)
    older_there = kv.GetMetaResponse(cas=40, rev_seqno=4)
    assert not would_win(ConflictMode.SEQNO, large, newer_there)
    assert would_win(ConflictMode.SEQNO, large, older_there)
    assert would_win(ConflictMode.SEQNO, large, None)
    assert not would_win(ConflictMode.SEQNO, large, kv.GetMetaResponse(cas=50, rev_seqno=5))


def test_requests_carry_the_source_metadata() -> None:
    req = write_request(mutation(b"k", b"{}", rev=7, cas=70), ConflictMode.SEQNO, 9)
    assert isinstance(req, kv.SetWithMeta) and not isinstance(req, kv.DelWithMeta)
    assert (req.vbucket, req.rev_seqno, req.meta_cas, req.datatype, req.options) == (
        9, 7, 70, 1, None,
    )  # fmt: skip
    gone = write_request(Expiration(0, b"k", 3, 8, 80, AT, 1234), ConflictMode.LWW, 2)
    assert isinstance(gone, kv.DelWithMeta)
    assert gone.options == WithMetaOption.IS_EXPIRATION | WithMetaOption.FORCE_ACCEPT
    assert (gone.expiration, gone.rev_seqno, gone.meta_cas) == (1234, 8, 80)


U32, U64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
KEYS = st.binary(min_size=1, max_size=250)
CHANGES = st.one_of(
    st.builds(Mutation, st.integers(0, 1023), KEYS, st.binary(max_size=300), U64, U64, U32,
              U32, U64, st.integers(0, 7), st.just(AT)),
    st.builds(Deletion, st.integers(0, 1023), KEYS, U64, U64, U64, st.just(AT), U32),
    st.builds(Expiration, st.integers(0, 1023), KEYS, U64, U64, U64, st.just(AT), U32),
)  # fmt: skip
QUIET = {kv.SetWithMeta: kv.SetqWithMeta, kv.DelWithMeta: kv.DelqWithMeta}


@given(CHANGES, st.sampled_from(ConflictMode), U32)
def test_the_fused_frame_is_the_quiet_form_of_the_request(
    change: Change, mode: ConflictMode, opaque: int
) -> None:
    loud = write_request(change, mode, change.vbucket)
    fields = {f.name: getattr(loud, f.name) for f in dataclasses.fields(loud)}
    quiet = QUIET[type(loud)](**{**fields, "opaque": opaque})
    assert write_frame(change, write_options(mode), opaque) == quiet.encode()
