"""The hash table on its own (no vbucket, no storage): its entries and the counts it keeps by
arithmetic (memory, live keys, the highest deleted rev seqno, whether anything may expire)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.engine.hash_table import HashTable
from dcpkv.engine.item import ITEM_OVERHEAD, Item


def assert_counts(table: HashTable) -> None:
    entries = table.values()
    assert len(table) == len(entries)
    assert table.memory == sum(i.size() for i in entries)
    assert table.live == sum(1 for i in entries if not i.deleted)


def test_store_over_nothing_a_version_and_a_tombstone() -> None:
    table = HashTable()
    a = Item(b"k", b"v" * 10, rev_seqno=1, by_seqno=1)
    assert table.store(a, None) == ITEM_OVERHEAD + 1 + 10 == table.memory
    assert (table.entries.get(b"k"), table.live, len(table)) == (a, 1, 1)
    b = Item(b"k", b"w" * 4, rev_seqno=2, by_seqno=2)
    table.store(b, a)
    assert (table.entries.get(b"k"), table.memory, table.live) == (b, ITEM_OVERHEAD + 1 + 4, 1)
    gone = Item(b"k", b"", rev_seqno=3, by_seqno=3, deleted=True)
    table.store(gone, b)
    assert (table.live, len(table), table.max_deleted_rev) == (0, 1, 3)
    assert table.entries.get(b"missing") is None


def test_discard_removes_only_the_version_given() -> None:
    table = HashTable()
    tombstone = Item(b"k", b"", rev_seqno=4, by_seqno=4, deleted=True)
    table.replace(tombstone)
    newer = Item(b"k", b"v", rev_seqno=5, by_seqno=5)
    table.replace(newer)
    table.discard(tombstone)  # persisted, but the key was written again since: it stays
    assert table.entries.get(b"k") is newer
    table.replace(tombstone2 := Item(b"k", b"", rev_seqno=6, by_seqno=6, deleted=True))
    table.discard(tombstone2)
    assert (table.entries.get(b"k"), len(table), table.memory, table.live) == (None, 0, 0, 0)
    assert table.max_deleted_rev == 6  # rev seqnos never go back, the tombstone gone or not


@pytest.mark.parametrize(
    ("persisted", "target", "ejected"),
    [
        (0, None, []),  # nothing persisted: nothing may go
        (2, None, [b"a", b"b"]),  # up to seqno 2 only
        (9, None, [b"a", b"b", b"c"]),  # every live value (the tombstone has none to drop)
        (9, 1, [b"a"]),  # stops once the target is freed
    ],
)
def test_eject_drops_persisted_values(
    persisted: int, target: int | None, ejected: list[bytes]
) -> None:
    table = HashTable()
    for seqno, key in enumerate([b"a", b"b", b"c"], start=1):
        table.replace(Item(key, b"x" * 10, by_seqno=seqno))
    table.replace(Item(b"d", b"", by_seqno=4, deleted=True))
    freed = table.eject(persisted, target)
    assert freed == 10 * len(ejected)
    assert [i.key for i in table.values() if i.value is None] == ejected
    assert_counts(table)


def test_expiring_walks_only_while_something_may_expire() -> None:
    table = HashTable()
    table.replace(Item(b"a", b"v"))
    assert not table.may_expire and table.expiring() == []
    table.replace(soon := Item(b"b", b"v", expiry=100))
    table.replace(Item(b"c", b"", expiry=100, deleted=True))  # a tombstone does not expire
    assert table.may_expire and table.expiring() == [soon]
    table.replace(Item(b"b", b"v"))  # the expiry is gone
    assert table.expiring() == [] and not table.may_expire  # the walk found none: cleared


def test_clear_forgets_the_entries_and_keeps_the_deleted_rev() -> None:
    table = HashTable()
    table.replace(Item(b"a", b"v", rev_seqno=7, deleted=True))
    table.replace(Item(b"b", b"v"))
    table.clear()
    assert (len(table), table.memory, table.live, table.max_deleted_rev) == (0, 0, 0, 7)
    assert table.entries.get(b"b") is None  # entries is the cleared dict itself


KEYS = [b"a", b"bb"]
versions = st.builds(
    Item,
    key=st.sampled_from(KEYS),
    value=st.sampled_from([b"", b"v", b"value" * 8, None]),
    expiry=st.sampled_from([0, 0, 50]),
    rev_seqno=st.integers(0, 20),
    by_seqno=st.integers(0, 20),
    deleted=st.booleans(),
)
ops = st.one_of(
    st.tuples(st.just("replace"), versions),
    st.tuples(st.just("discard"), st.sampled_from(KEYS)),
    st.tuples(st.just("eject"), st.integers(0, 20)),
    st.tuples(st.just("clear"), st.none()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ops, max_size=30))
def test_the_counts_are_the_sums_whatever_the_changes(changes: list[tuple[str, object]]) -> None:
    table = HashTable()
    deleted_revs = [0]
    for op, arg in changes:
        if op == "replace":
            assert isinstance(arg, Item)
            table.replace(arg)
            if arg.deleted:
                deleted_revs.append(arg.rev_seqno)
        elif op == "discard":
            entry = table.entries.get(arg)  # type: ignore[arg-type]
            if entry is not None:
                table.discard(entry)
        elif op == "eject":
            table.eject(arg)  # type: ignore[arg-type]
        else:
            table.clear()
        assert_counts(table)
        assert table.max_deleted_rev == max(deleted_revs)
        if any(i.expiry and not i.deleted for i in table.values()):
            assert table.may_expire
