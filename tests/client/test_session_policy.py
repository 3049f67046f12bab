"""The consumer's session policy without a socket: routing, re-requests, retry and backoff."""

from __future__ import annotations

import random

import pytest

from dcpkv.client.consumer_stream import ConsumerState, ConsumerStream
from dcpkv.client.session_policy import (
    FIRST_BACKOFF,
    Backoff,
    StreamRun,
    refusal_delay,
)
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.status import Status
from dcpkv.protocol import dcp
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import Opcode, StreamEndReason

LOG = (FailoverEntry(0xAA, 0),)


class FixedRandom(random.Random):
    """``random()`` always answers ``value``: the jitter becomes a known factor."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def run_of(*vbuckets: int, clamp: bool = False) -> StreamRun:
    return StreamRun({vb: ConsumerStream(vb) for vb in vbuckets}, clamp=clamp)


def requested(run: StreamRun, vb: int, opaque: int) -> ConsumerStream:
    cs = run.streams[vb]
    cs.request(opaque=opaque)
    run.opaques[opaque] = vb
    return cs


# -- Backoff -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cap", "jitter", "delays"),
    [
        # no jitter factor left (random() = 1.0): the plain capped doubling
        (5.0, 1.0, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]),
        # random() = 0.0: half of each step
        (5.0, 0.0, [0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.5, 2.5]),
        (0.2, 1.0, [0.05, 0.1, 0.2, 0.2]),
    ],
)
def test_backoff_doubles_from_the_first_step_up_to_the_cap(
    cap: float, jitter: float, delays: list[float]
) -> None:
    backoff = Backoff(cap, rng=FixedRandom(jitter))
    assert [backoff.next_delay() for _ in delays] == pytest.approx(delays)


def test_backoff_starts_over_once_a_session_opened() -> None:
    backoff = Backoff(5.0, rng=FixedRandom(1.0))
    backoff.next_delay()
    backoff.next_delay()
    backoff.opened()
    assert backoff.next_delay() == pytest.approx(FIRST_BACKOFF)


def test_backoff_jitter_stays_between_half_and_all_of_the_step() -> None:
    backoff = Backoff(5.0, rng=random.Random(7))
    for attempt in range(12):
        step = min(5.0, FIRST_BACKOFF * 2**attempt)
        assert step / 2 <= backoff.next_delay() <= step


@pytest.mark.parametrize(
    ("refusals", "cap", "delay"),
    [(1, 5.0, 0.2), (2, 5.0, 0.4), (5, 5.0, 3.2), (6, 5.0, 5.0), (3, 0.5, 0.5)],
)
def test_refusal_delay(refusals: int, cap: float, delay: float) -> None:
    assert refusal_delay(refusals, cap) == pytest.approx(delay)


# -- routing ---------------------------------------------------------------------------------


def test_messages_reach_their_stream_or_nobody() -> None:
    run = run_of(0, 1)
    requested(run, 1, opaque=9)
    cases: list[tuple[Message, int | None]] = [
        (dcp.SnapshotMarker(vbucket=0, start_seqno=0, end_seqno=1, flags=1), 0),
        (dcp.Mutation(vbucket=1, key=b"k", value=b"v", by_seqno=1), 1),
        (dcp.StreamEnd(vbucket=0, reason=StreamEndReason.OK), 0),
        (dcp.Mutation(vbucket=7, key=b"k", value=b"v", by_seqno=1), None),  # not ours
        (dcp.StreamRequestOk(opaque=9, failover_log=LOG), 1),  # by its opaque...
        (dcp.StreamRequestOk(opaque=9, failover_log=LOG), None),  # ...used once
        (GenericResponse(opcode=Opcode.DcpStreamRequest, opaque=5, status=Status.Erange), None),
        (GenericResponse(opcode=Opcode.Noop, opaque=9), None),
    ]
    for msg, vb in cases:
        cs = run.stream_for(msg)
        assert (None if cs is None else cs.vbucket) == vb, msg


# -- requests --------------------------------------------------------------------------------


def test_a_new_session_requests_every_stream_that_needs_it() -> None:
    run = run_of(0, 1, 2)
    requested(run, 1, opaque=1)
    assert [cs.vbucket for cs in run.first_requests()] == [0, 2]


@pytest.mark.parametrize(
    ("clamp", "vbuckets", "at_once"),
    [(False, (0, 1), False), (True, (0,), False), (True, (0, 1), True)],
)
def test_high_seqnos_read_at_once_only_to_clamp_several_requests(
    clamp: bool, vbuckets: tuple[int, ...], at_once: bool
) -> None:
    assert run_of(*vbuckets, clamp=clamp).reads_highs_at_once() is at_once


def test_a_refused_stream_waits_out_its_retry_then_is_due() -> None:
    run = run_of(0, 1)
    cs = run.streams[0]
    assert run.wants_request(cs)
    run.refused(0, now=100.0, cap=5.0)
    assert not run.wants_request(cs)
    assert run.retry_timeout(100.0) == pytest.approx(0.2)
    assert run.retry_timeout(101.0) == 0.0
    assert run.due_retries(100.1) == []
    assert run.due_retries(100.2) == [cs]
    assert run.retry_timeout(100.2) is None
    assert run.wants_request(cs)


def test_consecutive_refusals_double_until_a_stream_starts() -> None:
    run = run_of(0)
    for n, delay in enumerate([0.2, 0.4, 0.8], start=1):
        run.refused(0, now=0.0, cap=5.0)
        assert run.refusals[0] == n
        assert run.retry_at[0] == pytest.approx(delay)
        run.due_retries(10.0)
    run.started(0)
    run.refused(0, now=0.0, cap=5.0)
    assert run.retry_at[0] == pytest.approx(0.2)


def test_a_streaming_vbucket_wants_no_request() -> None:
    run = run_of(0)
    cs = requested(run, 0, opaque=3)
    assert not run.wants_request(cs)


# -- sessions --------------------------------------------------------------------------------


def test_an_ended_session_forgets_its_opaques_and_highs_and_asks_again() -> None:
    run = run_of(0, 1)
    requested(run, 0, opaque=4)
    run.highs = {0: 10}
    run.refused(1, now=0.0, cap=5.0)
    run.session_ended()
    assert run.opaques == {} and run.highs == {}
    assert run.retry_at == {1: pytest.approx(0.2)}  # the retry schedule outlives a session
    assert run.streams[0].needs_request


def test_finished_once_every_stream_ended_or_failed() -> None:
    run = run_of(0, 1)
    assert not run.finished
    for vb in (0, 1):
        cs = requested(run, vb, opaque=vb + 1)
        cs.receive(dcp.StreamRequestOk(opaque=vb + 1, failover_log=LOG))
        cs.receive(dcp.StreamEnd(vbucket=vb, reason=StreamEndReason.OK))
        assert cs.state is ConsumerState.ENDED
    assert run.finished


# -- a session across nodes ------------------------------------------------------------------


def on_node(run: StreamRun, vb: int, opaque: int, node: str) -> ConsumerStream:
    cs = run.streams[vb]
    cs.request(opaque=opaque)
    run.requested(vb, opaque, node)
    return cs


def test_a_message_reaches_its_stream_only_from_the_node_it_was_requested_on() -> None:
    run = run_of(0, 1)
    on_node(run, 0, 1, "a")
    on_node(run, 1, 2, "b")
    mutation = dcp.Mutation(vbucket=0, key=b"k", value=b"v", by_seqno=1)
    assert run.stream_for(mutation, "a") is run.streams[0]
    assert run.stream_for(mutation, "b") is None  # a late message from another node
    assert run.stream_for(dcp.StreamRequestOk(opaque=2, failover_log=LOG), "b") is run.streams[1]


def test_a_lost_node_resumes_only_its_own_streams_after_a_pause() -> None:
    run = run_of(0, 1, 2)
    on_node(run, 0, 1, "a")
    on_node(run, 1, 2, "b")
    on_node(run, 2, 3, "a")
    assert run.node_lost("a", now=10.0, cap=5.0) == [0, 2]
    for vb in (0, 2):
        assert run.streams[vb].state is ConsumerState.RESUMING
        assert not run.wants_request(run.streams[vb])  # not at once: the map must catch up
    assert run.retry_at == {0: pytest.approx(10.2), 2: pytest.approx(10.2)}
    assert run.streams[1].state is ConsumerState.REQUESTED  # the other node goes on
    assert run.where == {1: "b"}
    assert run.node_lost("a", now=11.0, cap=5.0) == []  # nothing left there
    # resumed on another node, a stream's messages come from there
    on_node(run, 0, 4, "b")
    mutation = dcp.Mutation(vbucket=0, key=b"k", value=b"v", by_seqno=1)
    assert run.stream_for(mutation, "a") is None
