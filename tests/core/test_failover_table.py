"""The failover table: branches, pruning, sanitising, JSON and wire forms."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.core.failover_table import (
    FailoverEntry,
    FailoverTable,
    FailoverTableError,
    decode_wire,
    entries_from_json_obj,
)
from dcpkv.core.seqno import U64_MAX

E = FailoverEntry
u64 = st.integers(min_value=0, max_value=U64_MAX)


def table(*pairs: tuple[int, int], capacity: int = 25) -> FailoverTable:
    return FailoverTable([E(u, s) for u, s in pairs], capacity=capacity, rng=random.Random(7))


def test_fresh_table_has_one_random_nonzero_entry_at_the_high_seqno() -> None:
    t = FailoverTable.fresh(42, rng=random.Random(1))
    assert len(t) == 1
    assert t.latest.seqno == 42
    assert 0 < t.latest.uuid <= U64_MAX


def test_uuids_are_never_zero_nor_reused() -> None:
    class ZeroThenRepeat(random.Random):
        values = iter([0, 5, 5, 9])

        def getrandbits(self, k: int) -> int:
            return next(self.values)

    t = FailoverTable(capacity=25, rng=ZeroThenRepeat())
    assert t.create_entry(0).uuid == 5
    assert t.create_entry(1).uuid == 9  # 5 is taken


def test_new_entry_drops_entries_above_it_then_pushes_in_front() -> None:
    t = table((30, 20), (20, 10), (10, 0))
    new = t.create_entry(15)
    assert t.entries == (new, E(20, 10), E(10, 0))
    assert new.seqno == 15


def test_new_entry_at_an_existing_seqno_keeps_that_entry() -> None:
    t = table((20, 10), (10, 0))
    new = t.create_entry(10)
    assert t.entries == (new, E(20, 10), E(10, 0))


def test_table_is_trimmed_to_capacity_oldest_first() -> None:
    t = table(capacity=3)
    made = [t.create_entry(s) for s in range(5)]
    assert t.entries == tuple(reversed(made[-3:]))


def test_prune_forgets_branches_above_the_rollback_seqno() -> None:
    t = table((30, 20), (20, 10), (10, 0))
    t.prune(10)
    assert t.entries == (E(20, 10), E(10, 0))
    t.prune(0)
    assert t.entries == (E(10, 0),)


def test_pruning_every_branch_leaves_a_consumer_with_uuid_zero() -> None:
    t = table((30, 5))
    t.prune(0)
    assert len(t) == 0
    assert t.latest_uuid == 0
    with pytest.raises(FailoverTableError):
        _ = t.latest


@pytest.mark.parametrize(
    ("stored", "kept"),
    [
        # in order: kept as it is
        ([(3, 20), (2, 10), (1, 0)], [(3, 20), (2, 10), (1, 0)]),
        # uuid 0 is dropped wherever it stands
        ([(0, 20), (2, 10), (0, 5), (1, 0)], [(2, 10), (1, 0)]),
        # an entry newer in seqno than the one kept before it is dropped
        ([(3, 5), (2, 10), (1, 0)], [(3, 5), (1, 0)]),
        ([(3, 5), (2, 7), (4, 6), (1, 5)], [(3, 5), (1, 5)]),
    ],
)
def test_sanitising_a_loaded_table(stored: list, kept: list) -> None:
    doc = json.dumps([{"id": u, "seq": s} for u, s in stored])
    assert FailoverTable.from_json(doc, high_seqno=99).entries == tuple(E(*p) for p in kept)


def test_sanitising_to_nothing_gives_a_fresh_entry_at_the_high_seqno() -> None:
    t = FailoverTable.from_json('[{"id":0,"seq":3}]', high_seqno=99, rng=random.Random(3))
    assert len(t) == 1
    assert t.latest.seqno == 99
    assert t.latest.uuid != 0
    assert FailoverTable.from_json("[]", high_seqno=4).latest.seqno == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ('{"id":1,"seq":0}', "JSON array"),
        ('[{"id":1}]', "entry 0"),
        ('[{"id":1,"seq":0},[1,2]]', "entry 1"),
        ('[{"id":"1","seq":0}]', "entry 0 id must be an integer"),
        ('[{"id":1,"seq":1.5}]', "entry 0 seq must be an integer"),
        ('[{"id":true,"seq":0}]', "must be an integer"),
        ('[{"id":-1,"seq":0}]', "unsigned 64-bit"),
        ('[{"id":18446744073709551616,"seq":0}]', "unsigned 64-bit"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_malformed_json_is_a_clear_error(text: str | bytes, message: str) -> None:
    with pytest.raises(FailoverTableError, match=message):
        FailoverTable.from_json(text, high_seqno=0)


def test_json_form_is_the_spec_form_and_64_bit_exact() -> None:
    t = table((U64_MAX, U64_MAX - 1), (1, 0))
    assert t.to_json() == f'[{{"id":{U64_MAX},"seq":{U64_MAX - 1}}},{{"id":1,"seq":0}}]'
    assert FailoverTable.from_json(t.to_json(), high_seqno=0) == t


def test_wire_form_is_16_bytes_per_entry_big_endian_newest_first() -> None:
    t = table((0x0102030405060708, 9), (0xFFFFFFFFFFFFFFFF, 0))
    assert t.to_wire() == (
        bytes.fromhex("0102030405060708") + (9).to_bytes(8, "big") + b"\xff" * 8 + bytes(8)
    )
    assert FailoverTable.from_wire(t.to_wire()) == t


@pytest.mark.parametrize("size", [0, 1, 15, 17, 31])
def test_malformed_wire_body_is_a_clear_error(size: int) -> None:
    with pytest.raises(FailoverTableError, match=r"empty|16-byte"):
        decode_wire(bytes(size))


@given(st.lists(st.tuples(u64, u64), min_size=1, max_size=40))
def test_wire_and_json_round_trip(pairs: list[tuple[int, int]]) -> None:
    entries = [E(u, s) for u, s in pairs]
    t = FailoverTable(entries, capacity=len(entries))
    assert FailoverTable.from_wire(t.to_wire()).entries == tuple(entries)
    assert entries_from_json_obj(json.loads(t.to_json())) == entries


@given(st.lists(st.integers(min_value=0, max_value=1000), max_size=60))
def test_branches_stay_newest_first_with_non_increasing_seqnos(cuts: list[int]) -> None:
    t = FailoverTable.fresh(0, capacity=5, rng=random.Random(0))
    for seqno in cuts:
        entry = t.create_entry(seqno)
        assert t.latest == entry
        seqnos = [e.seqno for e in t]
        assert seqnos == sorted(seqnos, reverse=True)
        assert len(t) <= 5
        assert len({e.uuid for e in t}) == len(t)
        # a sanitised reload of a healthy table changes nothing
        assert FailoverTable.from_json(t.to_json(), high_seqno=seqno) == t


@pytest.mark.parametrize(
    ("pairs", "seqno", "uuid"),
    [
        ([(9, 30), (5, 0)], 30, 5),  # a branch cut at 30 wrote nothing at or below 30
        ([(9, 30), (5, 0)], 31, 9),  # it wrote 31: its own
        ([(9, 30), (8, 30), (5, 0)], 30, 5),  # two empty branches in a row
        ([(9, 30), (5, 10), (4, 0)], 30, 5),  # 5 wrote 11..30
        ([(9, 0)], 0, 9),  # nothing held: the latest
        ([(9, 30)], 30, 9),  # no older branch: the latest
        ([], 0, 0),  # no history at all
    ],
)
def test_the_uuid_a_stream_is_asked_with(pairs: list, seqno: int, uuid: int) -> None:
    assert table(*pairs).uuid_holding(seqno) == uuid
