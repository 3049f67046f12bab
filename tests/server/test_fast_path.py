"""The request fast path answers exactly what the general path answers (no sockets).

Two identical buckets (same clock, same failover uuids) receive the same pipelined chunk: one
through :func:`serve_plain` and then the parser for whatever it leaves (as the server does),
the other through the general path alone. The answers must be the same bytes, the buckets
must end in the same state and the refusals counted alike, whatever mix of plain and unusual
requests the chunk holds (expired and xattr-carrying keys among them), whoever sends it (an
administrator, a reader, a writer, a user with no role on the bucket). With-meta writes (XDCR)
mixed in, on buckets of both conflict-resolution modes, must also leave the same write queue
(what DCP streams: every version with its CAS, rev seqno and seqno, in order) and win or lose
conflict resolution alike.
"""

from __future__ import annotations

import itertools
import queue
import random
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.core.conflict_resolution import ConflictMode
from dcpkv.core.rbac import UserRecord, UsersDoc, parse_roles
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState, vbucket_for_key
from dcpkv.engine import document
from dcpkv.engine.bg_fetcher import Landing
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hash_table import EvictionPolicy
from dcpkv.engine.hlc import ManualClock
from dcpkv.protocol import kv
from dcpkv.protocol.constants import Datatype, HelloFeature, Magic, Opcode
from dcpkv.protocol.frame import FrameParser, encode_frame
from dcpkv.server import kv_handlers, with_meta
from dcpkv.server.config import ServerSettings
from dcpkv.server.connection import Connection
from dcpkv.server.dispatch import ROUTES, handle
from dcpkv.server.fast_path import _SERVE, serve_chunk, serve_plain
from dcpkv.server.state import ServerState

VBUCKETS = 4
MAX_VALUE = 2048
_EXTRAS = struct.Struct(">II")
# keys of the active vbuckets (0 and 1), k0 left out (it has xattrs: a Get of it is general)
MINE = [k for k in (b"k%d" % i for i in range(1, 99)) if vbucket_for_key(k, VBUCKETS) < 2][:9]
# the roles of the users sending the chunk (the administrator has every privilege)
ROLES = {"reader": "data_reader[default]", "writer": "data_writer[default]",
         "stranger": "data_reader[other]"}  # fmt: skip
USERS = UsersDoc(1, {n: UserRecord.create(n, "pw", parse_roles(r), 1) for n, r in ROLES.items()})
# k0 carries a system xattr (kept by a Set over it) and a user one (replaced by it)
XATTRS = {"_sys": b'{"a":1}', "user": b"2"}


@contextmanager
def served(
    quota: int, features: set[HelloFeature], user: str = "Administrator",
    mode: ConflictMode = ConflictMode.SEQNO, eviction: EvictionPolicy = EvictionPolicy.VALUE_ONLY,
) -> Iterator[tuple[Connection, Bucket]]:  # fmt: skip
    with TemporaryDirectory() as tmp:
        bucket = Bucket(
            "default", Path(tmp), num_vbuckets=VBUCKETS, clock=ManualClock(),
            rng=random.Random(5), memory_quota=quota, max_item_size=1024, conflict_mode=mode,
            eviction_policy=eviction,
        )  # fmt: skip
        for vb in range(VBUCKETS - 1):  # the last one stays missing, the one before is a replica
            bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
        bucket.set_vbucket_state(VBUCKETS - 2, VBucketState.REPLICA)
        value, datatype = document.Document(XATTRS, b'{"v":0}', True).pack()
        bucket.vbuckets[vbucket_for_key(b"k0", VBUCKETS)].set(b"k0", value, datatype=datatype)
        state = ServerState(ServerSettings(port=12000, data_dir=Path(tmp)))
        state.users.adopt(USERS)
        state.buckets["default"] = bucket
        conn = Connection(state, peer="test", initial_bucket="default")
        conn.authenticated(user)
        conn.features = set(features)
        conn.datatype_mask = 0xFF if HelloFeature.Datatype in features else 0
        try:
            yield conn, bucket
        finally:
            bucket.shutdown()


def general(conn: Connection, data: bytes) -> list[bytes]:
    return [a for f in FrameParser(MAX_VALUE).feed(data) if (a := handle(conn, f))]


def fast(conn: Connection, data: bytes, cuts: list[int] = []) -> list[bytes]:  # noqa: B006
    """The server's way: serve_chunk on each chunk (``data`` cut at ``cuts``), with a parser
    and the dispatcher for what it leaves."""
    parser = FrameParser(MAX_VALUE)

    def rest(data: bytes, out: list[bytes]) -> bool:
        out.extend(a for f in parser.feed(data) if (a := handle(conn, f)))
        return True

    out: list[bytes] = []
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for start, stop in itertools.pairwise(bounds):
        serve_chunk(conn, parser, data[start:stop], out, rest)
    return out


def state_of(bucket: Bucket) -> list[object]:
    return [
        (
            vb.id,
            vb.high_seqno,
            vb.memory_used,
            sorted((i.key, repr(i)) for i in vb.hash_table.values()),
        )
        for vb in bucket.vbuckets.values()
    ]


# vbuckets 0 and 1 are active, 2 a replica, 3 missing (checked below)
keys = st.sampled_from([b"k0", b"k3", b"k7", b"k0", b"k3", b"x" * 250, b"k1", b"a", b""])
request = st.tuples(
    st.sampled_from(
        [
            Opcode.Get,
            Opcode.Set,
            Opcode.GetQ,
            Opcode.SetQ,
            Opcode.GetK,
            Opcode.GetKQ,
            Opcode.Delete,
            Opcode.Add,
        ]
    ),
    keys,
    st.sampled_from([b"", b"v", b'{"a":1}', b"v" * 1100]),  # 1100: over the item size
    st.sampled_from([0, 0, 0, Datatype.JSON, Datatype.Snappy]),
    st.sampled_from([0, 0, 0, 7]),  # cas
    st.sampled_from([0, 0, 0, 100, 2_592_001]),  # expiry (2,592,001: long past, expired at once)
    st.sampled_from([None, None, None, VBUCKETS - 1, VBUCKETS - 2]),  # None: the key's vbucket
    st.sampled_from([True, True, True, False]),  # usual extras (False: a Get with, a Set without)
)


def encode(i: int, op: Opcode, key: bytes, value: bytes, dt: int, cas: int, exp: int,
           vb: int | None, usual: bool) -> bytes:  # fmt: skip
    vbucket = vb if vb is not None else vbucket_for_key(key, VBUCKETS) if key else 0
    is_get = op in (Opcode.Get, Opcode.GetQ, Opcode.GetK, Opcode.GetKQ)
    has_extras = is_get != usual
    return encode_frame(
        Magic.ClientRequest, op, key=key, value=b"" if is_get else value, datatype=dt,
        extras=_EXTRAS.pack(3, exp) if has_extras else b"", cas=cas, vbucket=vbucket, opaque=i,
    )  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(
    st.lists(request, min_size=1, max_size=40),
    st.sampled_from([1 << 30, 4000]),  # 4000 bytes: writes run into the memory quota
    st.sampled_from([set(), {HelloFeature.MutationSeqno, HelloFeature.Datatype}]),
    st.lists(st.integers(0, 1 << 16), max_size=4),  # where the reads cut the byte stream
    st.sampled_from(["Administrator", "Administrator", *ROLES]),
)
def test_fast_path_answers_like_the_general_path(
    requests: list[tuple], quota: int, features: set[HelloFeature], cuts: list[int], user: str
) -> None:
    data = b"".join(encode(i, *r) for i, r in enumerate(requests))
    with served(quota, features, user) as (c1, b1), served(quota, features, user) as (c2, b2):
        assert b"".join(fast(c1, data, cuts)) == b"".join(general(c2, data))
        assert state_of(b1) == state_of(b2)
        assert c1.server.eaccess == c2.server.eaccess


def write_queue(bucket: Bucket) -> list[object]:
    """What DCP streams from memory: each vbucket's checkpoints, their items in order."""
    return [
        [(c.snap_start, c.snap_end, [repr(i) for i in c.items]) for c in vb.checkpoints.checkpoints]
        for vb in bucket.vbuckets.values()
    ]


_OPTIONS = [int(o) for o in kv.WithMetaOption]
with_meta_request = st.tuples(
    st.sampled_from(sorted(kv.WITH_META_RESPONSES)),
    keys,
    st.sampled_from([b"", b"", b"v", b'{"a":1}', b"v" * 1100]),
    st.sampled_from([0, 0, 0, 0, Datatype.JSON, Datatype.Snappy, Datatype.Xattr]),
    st.sampled_from([0, 0, 0, 0, 0, 7]),  # the header's CAS
    st.sampled_from([24, 24, 24, 28, 28, 26, 30, 20]),  # extras: options (28, 30), nmeta (26, 30)
    st.sampled_from([0, 0, 0, 0, 2, 0x20, *_OPTIONS, 0x0C, 0x04]),  # with 28 or 30 bytes
    st.sampled_from([0, 1, 5, 6, (1 << 63) - 1, 1 << 63]),  # rev seqno (SEQNO_MAX, past it)
    st.sampled_from([0, 1 << 48, 2 << 48, 2 << 48]),  # meta CAS (ties among them)
    st.sampled_from([0, 0, 3]),  # flags
    st.sampled_from([0, 0, 1_700_000_000]),  # expiration (a delete's: its time)
    st.sampled_from([None, None, None, VBUCKETS - 1, VBUCKETS - 2]),  # None: the key's vbucket
)


def encode_with_meta(i: int, op: int, key: bytes, value: bytes, dt: int, cas: int, extlen: int,
                     options: int, rev: int, meta_cas: int, flags: int, exp: int,
                     vb: int | None) -> bytes:  # fmt: skip
    vbucket = vb if vb is not None else vbucket_for_key(key, VBUCKETS) if key else 0
    extras = struct.pack(">IIQQ", flags, exp, rev & ((1 << 64) - 1), meta_cas)
    extras += {24: b"", 26: b"\0\x01", 28: struct.pack(">I", options),
               30: struct.pack(">IH", options, 1), 20: b""}[extlen]  # fmt: skip
    return encode_frame(
        Magic.ClientRequest, op, key=key, value=value, datatype=dt, extras=extras[:extlen],
        cas=cas, vbucket=vbucket, opaque=i,
    )  # fmt: skip


# a chunk's frames (their opaques given in order): plain requests and with-meta writes
mixed_frames = st.lists(
    st.one_of(
        request.map(lambda r: encode(0, *r)),
        with_meta_request.map(lambda r: encode_with_meta(0, *r)),
    ),
    min_size=1,
    max_size=40,
)
EVERY_FEATURE = {HelloFeature.MutationSeqno, HelloFeature.Datatype, HelloFeature.Xattr,
                 HelloFeature.Snappy}  # fmt: skip


# a replicator's writes: the shape the fast path serves, so conflict resolution decides there
replicated_frames = st.lists(
    st.tuples(
        st.sampled_from(sorted(kv.WITH_META_RESPONSES)),
        st.sampled_from([b"k3", b"k7", b"k1", b"a"]),
        st.sampled_from([b"", b"v", b'{"a":1}']),
        st.sampled_from([0, Datatype.JSON]),
        st.just(0),
        st.sampled_from([24, 28]),
        st.sampled_from([0, 0, 1, 2, 8, 0x0C, 0x10]),
        st.sampled_from([1, 5, 6]),
        st.sampled_from([1 << 48, 2 << 48, 3 << 48]),
        st.sampled_from([0, 3]),
        st.sampled_from([0, 1_700_000_000]),
        st.just(None),
    ).map(lambda r: encode_with_meta(0, *r)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=50, deadline=None)
@given(
    mixed_frames,
    st.sampled_from(list(ConflictMode)),
    st.sampled_from([1 << 30, 4000]),
    st.sampled_from([set(), EVERY_FEATURE]),
    st.lists(st.integers(0, 1 << 16), max_size=4),
    st.sampled_from(["Administrator", "Administrator", *ROLES]),
)
def test_with_meta_writes_are_answered_and_stored_as_the_general_path_does(
    frames: list[bytes], mode: ConflictMode, quota: int, features: set[HelloFeature],
    cuts: list[int], user: str,
) -> None:  # fmt: skip
    assert_same_as_general(frames, mode, quota, features, cuts, user)


@settings(max_examples=50, deadline=None)
@given(
    replicated_frames,
    st.sampled_from(list(ConflictMode)),
    st.sampled_from([set(), EVERY_FEATURE]),
    st.lists(st.integers(0, 1 << 16), max_size=4),
)
def test_replicated_writes_win_and_lose_as_on_the_general_path(
    frames: list[bytes], mode: ConflictMode, features: set[HelloFeature], cuts: list[int]
) -> None:
    assert_same_as_general(frames, mode, 1 << 30, features, cuts, "Administrator")


def assert_same_as_general(
    frames: list[bytes], mode: ConflictMode, quota: int, features: set[HelloFeature],
    cuts: list[int], user: str,
) -> None:  # fmt: skip
    """The same answers, stored items, write queue (DCP) and counters both ways."""
    data = b"".join(f[:12] + struct.pack(">I", i) + f[16:] for i, f in enumerate(frames))
    with served(quota, features, user, mode) as (c1, b1), served(quota, features, user, mode) as (
        c2, b2,
    ):  # fmt: skip
        assert b"".join(fast(c1, data, cuts)) == b"".join(general(c2, data))
        assert state_of(b1) == state_of(b2)
        assert write_queue(b1) == write_queue(b2)
        assert c1.server.eaccess == c2.server.eaccess
        assert c1.server.ops == c2.server.ops


def test_replicated_writes_take_the_fast_path_and_lose_conflict_resolution_there() -> None:
    """A batch of quiet with-meta writes (a replicator's) is served whole; sent again, every
    write is an identical version, refused (KeyExists) by conflict resolution, here too."""
    batch = b"".join(
        encode_with_meta(i, Opcode.SetqWithMeta, k, b"v", 0, 0, 24, 0, 3, 5 << 48, 0, 0, None)
        for i, k in enumerate(MINE)
    )
    with served(1 << 30, set()) as (conn, bucket):
        out: list[bytes] = []
        assert serve_plain(conn, batch, 0, out, MAX_VALUE) == len(batch) and out == []
        stored = [bucket.vbuckets[vbucket_for_key(k, VBUCKETS)].get(k) for k in MINE]
        assert {(i.cas, i.rev_seqno) for i in stored} == {(5 << 48, 3)}
        assert serve_plain(conn, batch, 0, out, MAX_VALUE) == len(batch)
        refused = list(FrameParser().feed(b"".join(out)))
        assert [f.status for f in refused] == [Status.KeyEexists] * len(MINE)


def test_the_keys_cover_every_kind_of_vbucket() -> None:
    vbs = {k: vbucket_for_key(k, VBUCKETS) for k in (b"k0", b"k3", b"k7", b"x" * 250, b"k1", b"a")}
    assert set(vbs.values()) == {0, 1, 2, 3}


def test_plain_gets_and_sets_take_the_fast_path() -> None:
    """The common shape is served whole (it did not just fall through to the parser)."""
    sets = b"".join(encode(i, Opcode.Set, k, b"v", 0, 0, 0, None, True) for i, k in enumerate(MINE))
    gets = b"".join(encode(i, Opcode.Get, k, b"", 0, 0, 0, None, True) for i, k in enumerate(MINE))
    with served(1 << 30, set()) as (conn, _):
        out: list[bytes] = []
        assert serve_plain(conn, sets + gets, 0, out, MAX_VALUE) == len(sets + gets)
        assert len(out) == 9 + 2 * 9  # a hit is a header and the value
        parsed = list(FrameParser().feed(b"".join(out)))
        assert [bytes(f.value) for f in parsed[9:]] == [b"v"] * 9


def test_a_partial_frame_is_left_to_the_parser() -> None:
    whole = encode(1, Opcode.Set, MINE[0], b"v", 0, 0, 0, None, True)
    with served(1 << 30, set()) as (conn, _):
        out: list[bytes] = []
        assert serve_plain(conn, whole + whole[:30], 0, out, MAX_VALUE) == len(whole)


def test_no_gate_no_fast_path() -> None:
    """Before login nothing is served here: the general path answers Eaccess."""
    data = encode(1, Opcode.Get, b"k", b"", 0, 0, 0, None, True)
    with served(1 << 30, set()) as (conn, _):
        conn.user = None
        out: list[bytes] = []
        assert serve_plain(conn, data, 0, out, MAX_VALUE) == 0 and out == []


def test_the_fast_path_serves_what_the_routes_hand_to_the_handlers_it_mirrors() -> None:
    """Its gates are the routes' (dispatch.closed_gate); its answers are those of these
    handlers, which the differential tests above hold it to."""
    mirrors = {Opcode.Get: kv_handlers.get, Opcode.GetQ: kv_handlers.get,
               Opcode.GetK: kv_handlers.get, Opcode.GetKQ: kv_handlers.get,
               Opcode.Set: kv_handlers.store, Opcode.SetQ: kv_handlers.store,
               **dict.fromkeys(kv.WITH_META_RESPONSES, with_meta.with_meta)}  # fmt: skip
    assert {op: ROUTES[op].handler for op in _SERVE} == mirrors


def test_a_user_without_the_privilege_is_refused_by_the_general_path() -> None:
    """A reader's Set and a writer's Get are left to the general path, which refuses them
    (Eaccess) and counts them, once each."""
    set_ = encode(1, Opcode.Set, MINE[1], b"v", 0, 0, 0, None, True)
    get = encode(2, Opcode.Get, MINE[1], b"", 0, 0, 0, None, True)
    for user, request in (("reader", set_), ("writer", get)):
        with served(1 << 30, set(), user) as (conn, _):
            out: list[bytes] = []
            assert serve_plain(conn, request, 0, out, MAX_VALUE) == 0 and out == []
            (answer,) = fast(conn, request)
            assert answer[6:8] == b"\x00\x24" and conn.server.eaccess == 1  # Eaccess


# -- Gets run again once their background fetch landed (full eviction) -------------------------

GETS = [Opcode.Get, Opcode.GetQ, Opcode.GetK, Opcode.GetKQ]


def with_fetches_ready(bucket: Bucket, keys: list[bytes]) -> None:
    """Persist, evict every item, then read ``keys`` in the background and land the reads
    without running anyone: they are ready, as while a connection runs its requests again."""
    bucket.flush_once()
    for vb in bucket.vbuckets.values():
        vb.eject()
    landings: queue.Queue[Landing] = queue.Queue()
    bucket.start_background_fetch(landings.put)
    for key in keys:
        bucket.vbuckets[vbucket_for_key(key, VBUCKETS)].wait_for(key, lambda: None)
    landed = 0
    while landed < len(set(keys)):
        for vb, key, fetched in landings.get(timeout=30):
            vb.land_fetch(key, fetched)
            landed += 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([*GETS, Opcode.Set]), st.sampled_from(range(7))),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([set(), {HelloFeature.Datatype}]),
)
def test_gets_answered_from_ready_fetches_match_the_general_path(
    requests: list[tuple[Opcode, int]], features: set[HelloFeature]
) -> None:
    """A full-eviction bucket whose keys are all on disk only, read by background fetches
    that landed: a Get of any kind (of a key on disk, one never written, one deleted on disk,
    one expired on disk, one written by a Set earlier in the chunk, one never written and
    never read, which storage's filters rule out) is answered by the fast path as the
    general path answers it, and the buckets end alike."""
    keys = [MINE[1], MINE[2], MINE[3], MINE[4], b"never", MINE[5], b"absent"]
    data = b"".join(
        encode(i, op, keys[k], b"new", 0, 0, 0, None, True) for i, (op, k) in enumerate(requests)
    )
    with (
        served(1 << 30, features, eviction=EvictionPolicy.FULL) as (c1, b1),
        served(1 << 30, features, eviction=EvictionPolicy.FULL) as (c2, b2),
    ):
        for bucket in (b1, b2):
            vbs = bucket.vbuckets
            for key in MINE[1:5]:
                vbs[vbucket_for_key(key, VBUCKETS)].set(key, b"v-" + key, flags=7)
            vbs[vbucket_for_key(MINE[5], VBUCKETS)].set(MINE[5], b"gone", expiry=2_592_001)
            vbs[vbucket_for_key(MINE[3], VBUCKETS)].delete(MINE[3])
            with_fetches_ready(bucket, keys[:-1])
        assert b1.vbuckets[vbucket_for_key(MINE[1], VBUCKETS)].fetches.ready
        assert b"".join(fast(c1, data)) == b"".join(general(c2, data))
        assert state_of(b1) == state_of(b2)


def test_gets_answered_without_a_read_take_the_fast_path() -> None:
    """(It did not just fall through to the general path.)"""
    with served(1 << 30, set(), eviction=EvictionPolicy.FULL) as (conn, bucket):
        for key in MINE[1:4]:
            bucket.vbuckets[vbucket_for_key(key, VBUCKETS)].set(key, b"v-" + key)
        with_fetches_ready(bucket, [*MINE[1:4], b"never"])
        gets = b"".join(
            encode(i, Opcode.GetK, k, b"", 0, 0, 0, None, True)
            for i, k in enumerate([*MINE[1:4], b"never", b"absent"])
        )
        out: list[bytes] = []
        assert serve_plain(conn, gets, 0, out, MAX_VALUE) == len(gets)
        answers = list(FrameParser().feed(b"".join(out)))
        assert [(f.status, bytes(f.key), bytes(f.value)) for f in answers] == [
            *((Status.Success, k, b"v-" + k) for k in MINE[1:4]),
            (Status.KeyEnoent, b"never", b""),
            (Status.KeyEnoent, b"absent", b""),  # (not read: the filters rule it out)
        ]
