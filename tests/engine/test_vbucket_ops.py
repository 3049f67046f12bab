"""memcached semantics of the front-end operations, table-driven."""

from __future__ import annotations

import pytest

from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.item import (
    DeltaBadval,
    Einval,
    EngineError,
    Item,
    KeyExists,
    KeyNotFound,
    NotMyVbucket,
    NotStored,
    TooBig,
)
from dcpkv.engine.vbucket import NO_CREATE, VBucket, absolute_expiry

GOOD_CAS = -1  # placeholder in the tables: "the current item's CAS"
BAD_CAS = 12345


def _cas(vb: VBucket, key: bytes, which: int) -> int:
    if which == GOOD_CAS:
        item = vb.peek(key)
        return item.cas if item else 999
    return which


@pytest.mark.parametrize(
    ("op", "exists", "cas", "error", "expected"),
    [
        ("set", False, 0, None, b"new"),
        ("set", True, 0, None, b"new"),
        ("set", True, GOOD_CAS, None, b"new"),
        ("set", True, BAD_CAS, KeyExists, b"old"),
        ("set", False, BAD_CAS, KeyNotFound, None),
        ("add", False, 0, None, b"new"),
        ("add", True, 0, KeyExists, b"old"),
        ("replace", False, 0, KeyNotFound, None),
        ("replace", True, 0, None, b"new"),
        ("replace", True, GOOD_CAS, None, b"new"),
        ("replace", True, BAD_CAS, KeyExists, b"old"),
        ("append", False, 0, NotStored, None),
        ("append", True, 0, None, b"oldnew"),
        ("append", True, BAD_CAS, KeyExists, b"old"),
        ("prepend", True, GOOD_CAS, None, b"newold"),
        ("prepend", False, 0, NotStored, None),
    ],
)
def test_store_semantics(
    vbucket: VBucket,
    op: str,
    exists: bool,
    cas: int,
    error: type[EngineError] | None,
    expected: bytes | None,
) -> None:
    if exists:
        vbucket.set(b"k", b"old")
    kwargs = {} if op == "add" else {"cas": _cas(vbucket, b"k", cas)}
    call = getattr(vbucket, op)
    if error is None:
        item = call(b"k", b"new", **kwargs)
        assert item.by_seqno == vbucket.high_seqno
    else:
        with pytest.raises(error):
            call(b"k", b"new", **kwargs)
    if expected is None:
        with pytest.raises(KeyNotFound):
            vbucket.get(b"k")
    else:
        assert vbucket.get(b"k").value == expected


@pytest.mark.parametrize(
    ("op", "start", "delta", "expiry", "error", "result"),
    [
        ("incr", None, 5, 0, None, 10),  # missing: created with the initial value
        ("incr", None, 5, NO_CREATE, KeyNotFound, None),
        ("decr", None, 5, NO_CREATE, KeyNotFound, None),
        ("incr", b"7", 5, 0, None, 12),
        ("decr", b"7", 5, 0, None, 2),
        ("decr", b"3", 5, 0, None, 0),  # floors at zero
        ("incr", b"18446744073709551615", 2, 0, None, 1),  # wraps at 2**64
        ("incr", b"abc", 1, 0, DeltaBadval, None),
        ("incr", b"", 1, 0, DeltaBadval, None),
        ("incr", b"-1", 1, 0, DeltaBadval, None),
        ("incr", b"18446744073709551616", 1, 0, DeltaBadval, None),
    ],
)
def test_counters(
    vbucket: VBucket,
    op: str,
    start: bytes | None,
    delta: int,
    expiry: int,
    error: type[EngineError] | None,
    result: int | None,
) -> None:
    if start is not None:
        vbucket.set(b"c", start)
    call = getattr(vbucket, op)
    if error is not None:
        with pytest.raises(error):
            call(b"c", delta, initial=10, expiry=expiry)
        return
    value, item = call(b"c", delta, initial=10, expiry=expiry)
    assert value == result
    assert item.value == str(result).encode()
    assert vbucket.get(b"c").value == str(result).encode()


def test_counter_cas_mismatch(vbucket: VBucket) -> None:
    vbucket.set(b"c", b"1")
    with pytest.raises(KeyExists):
        vbucket.incr(b"c", 1, cas=BAD_CAS)


def test_every_mutation_gets_seqno_cas_and_rev(vbucket: VBucket) -> None:
    a = vbucket.set(b"k", b"1")
    b = vbucket.set(b"k", b"2")
    d = vbucket.delete(b"k", cas=b.cas)
    c = vbucket.add(b"k", b"3")
    assert [a.by_seqno, b.by_seqno, d.by_seqno, c.by_seqno] == [1, 2, 3, 4]
    assert a.cas < b.cas < d.cas < c.cas
    assert [a.rev_seqno, b.rev_seqno, d.rev_seqno, c.rev_seqno] == [1, 2, 3, 4]
    assert d.deleted and d.value == b""


def test_cas_is_monotonic_when_the_clock_stands_still(vbucket: VBucket) -> None:
    cases = [vbucket.set(b"k%d" % i, b"v").cas for i in range(100)]
    assert cases == sorted(set(cases))
    assert cases[0] & 0xFFFF == 0  # physical time, low 16 bits clear


def test_delete_semantics(vbucket: VBucket) -> None:
    with pytest.raises(KeyNotFound):
        vbucket.delete(b"k")
    item = vbucket.set(b"k", b"v")
    with pytest.raises(KeyExists):
        vbucket.delete(b"k", cas=item.cas + 1)
    vbucket.delete(b"k", cas=item.cas)
    with pytest.raises(KeyNotFound):
        vbucket.delete(b"k")
    assert vbucket.peek(b"k").deleted  # tombstone kept until persisted


@pytest.mark.parametrize(
    ("exptime", "expected"),
    [
        (0, 0),
        (1, 1_700_000_001),
        (2_592_000, 1_700_000_000 + 2_592_000),  # 30 days: still relative
        (2_592_001, 2_592_001),  # above: absolute (long past: expires at once)
        (1_800_000_000, 1_800_000_000),
    ],
)
def test_expiry_rule(exptime: int, expected: int) -> None:
    assert absolute_expiry(exptime, 1_700_000_000.5) == expected


def test_expired_items_vanish_and_queue_an_expiration(vbucket: VBucket, clock: ManualClock) -> None:
    vbucket.set(b"rel", b"v", expiry=10)
    vbucket.set(b"abs", b"v", expiry=int(clock.now) + 20)
    vbucket.set(b"past", b"v", expiry=2_592_001)
    vbucket.set(b"forever", b"v")
    with pytest.raises(KeyNotFound):
        vbucket.get(b"past")
    clock.advance(10)
    with pytest.raises(KeyNotFound):
        vbucket.get(b"rel")
    assert vbucket.get(b"abs").value == b"v"
    clock.advance(10)
    assert vbucket.expiry_pager() == 1
    assert vbucket.get(b"forever").value == b"v"
    cursor = vbucket.checkpoints.register_cursor("dcp", 0)
    assert cursor is not None
    snap = cursor.next_snapshot()
    assert snap is not None
    expired = {i.key for i in snap.items if i.deleted and i.expired}
    assert expired == {b"rel", b"abs", b"past"}


def test_touch_and_get_and_touch(vbucket: VBucket, clock: ManualClock) -> None:
    with pytest.raises(KeyNotFound):
        vbucket.touch(b"k", 5)
    vbucket.set(b"k", b"v", expiry=5)
    item = vbucket.get_and_touch(b"k", 100)
    assert item.value == b"v" and item.expiry == int(clock.now) + 100
    clock.advance(50)
    assert vbucket.get(b"k").value == b"v"


def test_writes_refused_unless_active(vbucket: VBucket) -> None:
    for state in (VBucketState.REPLICA, VBucketState.PENDING, VBucketState.DEAD):
        vbucket.set_state(state)
        with pytest.raises(NotMyVbucket):
            vbucket.set(b"k", b"v")
        with pytest.raises(NotMyVbucket):
            vbucket.get(b"k")


def test_size_limits(vbucket: VBucket) -> None:
    with pytest.raises(Einval):
        vbucket.set(b"k" * 251, b"v")
    with pytest.raises(Einval):
        vbucket.set(b"", b"v")
    vbucket.max_item_size = 10
    with pytest.raises(TooBig):
        vbucket.set(b"k", b"x" * 11)
    vbucket.set(b"k", b"x" * 10)
    with pytest.raises(TooBig):
        vbucket.append(b"k", b"y")


def test_no_seqno_beyond_2_63_minus_1(vbucket: VBucket) -> None:
    """Seqnos and rev seqnos stay signed 64-bit (as in kv_engine; the Spark source's columns
    are BIGINT): a replica refuses a larger one, and the front end never issues one."""
    top = 2**63 - 1
    vbucket.set_state(VBucketState.REPLICA)
    with pytest.raises(Einval, match=f"vbucket 0: seqno {2**63} is beyond 2\\^63-1"):
        vbucket.replica_snapshot_marker(1, 2**63)
    vbucket.replica_snapshot_marker(1, top)
    with pytest.raises(Einval, match=f"seqno {2**64 - 1} is beyond"):
        vbucket.set_with_meta(Item(b"k", b"v", cas=1, by_seqno=2**64 - 1))
    with pytest.raises(Einval, match=f"rev seqno {2**63} is beyond"):
        vbucket.set_with_meta(Item(b"k", b"v", cas=1, rev_seqno=2**63, by_seqno=5))
    vbucket.set_with_meta(Item(b"k", b"v", cas=1, rev_seqno=top, by_seqno=top - 1))
    vbucket.set_state(VBucketState.ACTIVE)
    vbucket.set(b"other", b"v")  # seqno 2**63-1: the last one
    for write in (
        lambda: vbucket.set(b"more", b"v"),
        lambda: vbucket.delete(b"other"),
        lambda: vbucket.incr(b"n", 1, initial=0),
    ):
        with pytest.raises(Einval, match=f"seqno {2**63} is beyond"):
            write()
    assert vbucket.high_seqno == top and vbucket.get(b"other").value == b"v"


def _stored_with_expiry(vb: VBucket, how: str, expiry: int) -> None:
    if how == "set":
        vb.set(b"k", b"v", expiry=expiry)
    elif how == "add":
        vb.add(b"k", b"v", expiry=expiry)
    elif how == "touch":
        vb.set(b"k", b"v")
        vb.touch(b"k", expiry)
    elif how == "incr":
        vb.incr(b"k", 1, expiry=expiry)
    elif how == "load":
        vb.load([Item(b"k", b"v", expiry=expiry, cas=1, by_seqno=0)])
    elif how == "replica, then promoted":
        vb.set_state(VBucketState.REPLICA)
        vb.replica_snapshot_marker(vb.high_seqno + 1, vb.high_seqno + 1)
        vb.set_with_meta(Item(b"k", b"v", expiry=expiry, cas=1, by_seqno=vb.high_seqno + 1))
        vb.set_state(VBucketState.ACTIVE)


@pytest.mark.parametrize("how", ["set", "add", "touch", "incr", "load", "replica, then promoted"])
def test_the_pager_finds_an_expiry_however_it_was_stored(
    vbucket: VBucket, clock: ManualClock, how: str
) -> None:
    """The pager skips a vbucket whose walk found no expiry, until an item with one is
    stored: every way of storing one must say so."""
    vbucket.set(b"other", b"v")
    assert vbucket.expiry_pager() == 0  # a walk that finds no expiry: later walks are skipped
    _stored_with_expiry(vbucket, how, int(clock.now) + 5)
    clock.advance(6)
    assert vbucket.expiry_pager() == 1
    assert vbucket.peek(b"k").deleted  # type: ignore[union-attr]


def test_a_load_keeps_every_item_and_cas_stays_above_the_highest_loaded(
    vbucket: VBucket,
) -> None:
    """Warm-up's load: every item becomes its key's entry, and the next CAS is above every
    loaded CAS, wherever the highest one came in the load (not only the last)."""
    high = vbucket.hlc.next_cas() + (1 << 40)  # (far above what the clock gives next)
    cases = [high - 2, high, high - 1]
    loaded = [
        Item(b"k%d" % i, b"v", cas=cas, rev_seqno=1, by_seqno=i + 1) for i, cas in enumerate(cases)
    ]
    vbucket.load(loaded)
    assert [vbucket.peek(item.key) for item in loaded] == loaded
    assert len(vbucket) == 3
    assert vbucket.set(b"new", b"v").cas > high
