"""The replica side of DCP without sockets: a DcpProducer on one bucket feeds a DcpConsumer on
another through the codec's bytes, as two nodes would."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.consumer import OPAQUE_BASE, RETRY_S, DcpConsumer
from dcpkv.dcp.passive_stream import PassiveState, PassiveStream
from dcpkv.engine.bucket import Bucket
from dcpkv.protocol import dcp, snappy, xattr
from dcpkv.protocol.base import GenericResponse
from support.dcplink import VBS, Link, _decode


def state_of(bucket: Bucket) -> dict[int, dict[bytes, tuple[int, int, bytes, bool]]]:
    return {
        vb: {i.key: (i.by_seqno, i.cas, i.value or b"", i.deleted) for i in v.items()}
        for vb, v in bucket.vbuckets.items()
    }


def write(bucket: Bucket, n: int, prefix: str) -> None:
    for i in range(n):
        key = f"{prefix}{i}".encode()
        bucket.get_vbucket(bucket.vbucket_for(key)).set(key, f"{prefix}-{i}".encode())


def test_a_replica_applies_everything_with_the_actives_metadata(
    buckets: Callable[[str, VBucketState], Bucket],
) -> None:
    active, replica = buckets("a", VBucketState.ACTIVE), buckets("b", VBucketState.REPLICA)
    write(active, 40, "k")
    active.flush_once()  # part of it from disk, the rest from memory
    write(active, 20, "m")
    for key in (b"k3", b"m4"):
        active.get_vbucket(active.vbucket_for(key)).delete(key)
    link = Link(active, replica)
    link.connect()
    link.pump()
    assert state_of(replica) == state_of(active)
    for vb in range(VBS):
        assert replica.vbuckets[vb].failover.entries == active.vbuckets[vb].failover.entries
    assert link.consumer.items_received >= 60


def test_a_replica_rolls_back_when_its_active_branched(
    buckets: Callable[[str, VBucketState], Bucket],
) -> None:
    active, replica = buckets("a", VBucketState.ACTIVE), buckets("b", VBucketState.REPLICA)
    write(active, 30, "k")
    active.flush_once()
    link = Link(active, replica)
    link.connect()
    link.pump()
    replica.flush_once()
    write(active, 12, "lost")
    link.pump()  # the replica now holds writes the active will lose
    # the active dies without shutting down and comes back from its disk on a new branch
    active.storage.close()  # (the dead process holds its files no more)
    fresh = Bucket("default", active.path, num_vbuckets=VBS, synchronous="NORMAL",
                   clock=active.clock, rng=random.Random(9))  # fmt: skip
    assert not fresh.warmed_up_after_clean_shutdown
    link.active = fresh
    link.connect()
    link.pump()
    assert state_of(replica) == state_of(fresh)
    assert sum(s.rollbacks for s in link.consumer.streams.values()) > 0
    fresh.storage.close()


def test_a_former_active_back_after_a_crash_resumes_as_a_replica_without_rolling_back_to_0(
    buckets: Callable[[str, VBucketState], Bucket],
) -> None:
    """Delta recovery after kill -9: the old active's warm-up cut a branch at the end of its
    disk (no other node knows that uuid); made a replica of the promoted copy, it asks with
    the branch that wrote its data, so it keeps it and copies only what was written since."""
    old, other = buckets("a", VBucketState.ACTIVE), buckets("b", VBucketState.REPLICA)
    write(old, 30, "k")
    old.flush_once()
    link = Link(old, other)
    link.connect()
    link.pump()
    other.flush_once()
    old.storage.close()  # killed: nothing more reaches its disk, its files are let go
    crashed = Bucket("default", old.path, num_vbuckets=VBS, synchronous="NORMAL",
                     clock=old.clock, rng=random.Random(9))  # fmt: skip
    assert not crashed.warmed_up_after_clean_shutdown
    for vb in range(VBS):  # the failover promotes the other copies, the crashed node rejoins
        other.set_vbucket_state(vb, VBucketState.ACTIVE)
        crashed.set_vbucket_state(vb, VBucketState.REPLICA)
        assert crashed.vbuckets[vb].failover.latest.uuid != other.vbuckets[vb].uuid
    write(other, 6, "after")
    back = Link(other, crashed)
    back.connect()
    back.pump()
    assert state_of(crashed) == state_of(other)
    assert sum(s.rollbacks for s in back.consumer.streams.values()) == 0
    assert back.consumer.items_received == 6  # only what was written since
    crashed.storage.close()


# -- the passive stream's transitions ---------------------------------------------------------

TRANSITIONS = [
    # (event, state before, state after)
    ("accepted", PassiveState.AWAITING, PassiveState.READING),
    ("told_to_roll_back", PassiveState.AWAITING, PassiveState.ROLLING_BACK),
    ("rolled_back", PassiveState.ROLLING_BACK, PassiveState.PENDING),
    ("refused", PassiveState.AWAITING, PassiveState.PENDING),
    ("ended", PassiveState.READING, PassiveState.PENDING),
    ("ended", PassiveState.ENDED, PassiveState.ENDED),
    ("close", PassiveState.READING, PassiveState.ENDED),
]


def test_what_arrives_for_a_vbucket_set_dead_under_its_stream_is_dropped(
    buckets: Callable[[str, VBucketState], Bucket],
) -> None:
    """A move sets the old replica dead while its stream is open and changes are in flight:
    they are dropped for that vbucket (found under load: applying them raised NotMyVbucket and
    ended the replica's whole connection, every other vbucket's stream with it)."""
    active, replica = buckets("a", VBucketState.ACTIVE), buckets("b", VBucketState.REPLICA)
    link = Link(active, replica)
    link.connect()
    link.pump()
    dead = active.vbucket_for(b"k0")
    replica.set_vbucket_state(dead, VBucketState.DEAD)
    write(active, 40, "k")
    link.pump()  # nothing raised
    held, expected = state_of(replica), state_of(active)
    assert held.pop(dead) == {} and expected.pop(dead)
    assert held == expected  # every other vbucket's stream went on


@pytest.mark.parametrize(("event", "before", "after"), TRANSITIONS)
def test_passive_stream_transitions(
    buckets: Callable[[str, VBucketState], Bucket],
    event: str,
    before: PassiveState,
    after: PassiveState,
) -> None:
    stream = PassiveStream(buckets("b", VBucketState.REPLICA).vbuckets[0], OPAQUE_BASE)
    stream.state = before
    args: dict[str, tuple[object, ...]] = {
        "accepted": ((),), "told_to_roll_back": (5,), "refused": (RETRY_S,), "ended": (RETRY_S,),
    }  # fmt: skip
    getattr(stream, event)(*args.get(event, ()))
    assert stream.state is after


def test_a_refused_stream_asks_again_only_after_a_pause(
    buckets: Callable[[str, VBucketState], Bucket],
) -> None:
    consumer = DcpConsumer(buckets("b", VBucketState.REPLICA), "Replica:test", [0])
    (request,) = _decode(consumer.requests(now=0.0))
    assert isinstance(request, dcp.StreamRequest) and request.opaque == OPAQUE_BASE
    refusal = GenericResponse(opcode=request.opcode, opaque=request.opaque, status=0x07)
    consumer.handle(refusal, 24, now=1.0)
    assert consumer.requests(now=1.0) == []
    assert len(consumer.requests(now=1.0 + RETRY_S)) == 1


def test_a_stream_waits_to_ask_while_its_vbucket_rolls_back(
    buckets: Callable[[str, VBucketState], Bucket],
) -> None:
    """A rollback under way (ordered on a connection the shell replaced, say): asking now
    would ask from where the vbucket stands before it, and what came would land after it."""
    consumer = DcpConsumer(buckets("b", VBucketState.REPLICA), "Replica:test", [0, 1])
    (request,) = _decode(consumer.requests(now=0.0, held={0}))
    assert isinstance(request, dcp.StreamRequest) and request.vbucket == 1
    assert consumer.requests(now=0.0, held={0}) == []
    (request,) = _decode(consumer.requests(now=0.0))
    assert request.vbucket == 0


def test_a_pending_vbucket_is_taken_over_with_its_failover_log(
    buckets: Callable[[str, VBucketState], Bucket],
) -> None:
    """Rebalance's handoff without sockets: B holds vbucket 0 as a replica of A, the manager
    makes it pending, the stream is asked again with TakeOver, and once caught up A's copy
    ends dead and B's active, with A's failover log as it was (no new branch: a consumer
    following the vbucket resumes on B without a rollback)."""
    active, replica = buckets("a", VBucketState.ACTIVE), buckets("b", VBucketState.REPLICA)
    write(active, 40, "k")
    link = Link(active, replica)
    link.connect()
    link.pump()
    log_before = active.vbuckets[0].failover.entries
    replica.set_vbucket_state(0, VBucketState.PENDING)
    write(active, 40, "m")  # more lands before and while the takeover stream runs
    link.to_producer(link.consumer.set_vbuckets(range(VBS)))
    link.to_producer(link.consumer.requests(link.now))
    link.pump()
    assert active.vbuckets[0].state == VBucketState.DEAD
    assert replica.vbuckets[0].state == VBucketState.ACTIVE
    assert replica.vbuckets[0].failover.entries == log_before
    assert state_of(replica)[0] == state_of(active)[0]
    assert link.consumer.takeovers == 1
    # the other vbuckets were left as they were: still replicating
    assert [replica.vbuckets[vb].state for vb in range(1, VBS)] == [VBucketState.REPLICA] * 3
    assert [active.vbuckets[vb].state for vb in range(1, VBS)] == [VBucketState.ACTIVE] * 3


@pytest.mark.parametrize("state", [VBucketState.REPLICA, VBucketState.ACTIVE])
def test_a_takeover_step_for_a_vbucket_not_pending_is_refused(
    buckets: Callable[[str, VBucketState], Bucket], state: VBucketState
) -> None:
    """A copy the manager moved away meanwhile is never made active by a late handshake."""
    active, replica = buckets("a", VBucketState.ACTIVE), buckets("b", VBucketState.REPLICA)
    link = Link(active, replica)
    link.connect()
    link.pump()
    replica.set_vbucket_state(1, state)
    msg = dcp.SetVbucketState(opaque=OPAQUE_BASE + 1, vbucket=1, state=VBucketState.ACTIVE)
    answers, _ = link.consumer.handle(msg, 25, 0.0)
    (answer,) = _decode(answers)
    assert isinstance(answer, GenericResponse) and answer.status == 0x07  # NotMyVbucket
    assert replica.vbuckets[1].state == state


def test_a_replica_keeps_xattrs_and_the_content_of_compressed_values(
    buckets: Callable[[str, VBucketState], Bucket],
) -> None:
    active, replica = buckets("a", VBucketState.ACTIVE), buckets("b", VBucketState.REPLICA)
    body = b'{"doc":"' + b"x" * 200 + b'"}'
    with_xattrs, _ = xattr.join({"_sync": b'{"rev":1}', "user": b"2"}, body)
    for key, value, datatype in (
        (b"x", with_xattrs, 0x05), (b"z", snappy.deflate(body), 0x03), (b"gone", with_xattrs, 0x05),
    ):  # fmt: skip
        active.get_vbucket(active.vbucket_for(key)).set(key, value, datatype=datatype)
    tomb = active.get_vbucket(active.vbucket_for(b"gone")).delete(b"gone")
    assert xattr.decode(tomb.value or b"") == {"_sync": b'{"rev":1}'}
    link = Link(active, replica)
    link.connect()
    link.pump()
    # The replication connection does not negotiate Snappy: the value arrives inflated
    z = replica.get_vbucket(replica.vbucket_for(b"z")).peek(b"z")
    assert z is not None and (z.value, z.datatype) == (body, 0x01)
    for key in (b"x", b"gone"):
        a = active.get_vbucket(active.vbucket_for(key)).peek(key)
        r = replica.get_vbucket(replica.vbucket_for(key)).peek(key)
        assert a is not None and r is not None and (r.value, r.datatype) == (a.value, a.datatype)
