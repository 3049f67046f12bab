"""The fused mutation path (``fast_dcp.feed_mutations``) gives exactly what parse plus decode
gives: the same mutations with the same flow-control sizes, the same other frames in the same
order, the same refusals, whatever the mix of frames and however the stream is cut."""

from __future__ import annotations

import gc
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpkv.core.status import Status
from dcpkv.protocol import CodecError, Frame, FrameParser
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.dcp import DcpNoop, Mutation
from dcpkv.protocol.fast_dcp import RUN_MAX, MutationFields, feed_fields, feed_mutations
from dcpkv.protocol.frame import encode_frame
from support.protocol_samples import EXAMPLES, strategy_for

_MUTATION_MAGICS = (Magic.ClientRequest, Magic.AltClientRequest)


def _odd(magic: Magic, key: bytes, extras: int, framing: bytes = b"") -> bytes:
    return encode_frame(
        magic, Opcode.DcpMutation, key=key, extras=bytes(extras), framing_extras=framing
    )


# mutations the fused path must refuse to take, left for the general path to judge
ODD_MUTATIONS = [
    _odd(Magic.ClientRequest, b"k", 30),  # short extras: refused by decode
    _odd(Magic.ClientRequest, b"", 31),  # no key: refused by decode
    _odd(Magic.ClientResponse, b"k", 31),  # a response: not a mutation message
    _odd(Magic.ClientRequest, b"k", 31, b"\x22\x00\x05"),  # flex, with a stream id
]

_WIRE = st.one_of(
    strategy_for(Mutation).map(lambda m: m.encode()),  # with and without a stream id
    st.sampled_from([m.encode() for m in EXAMPLES] + ODD_MUTATIONS),
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def _event(frame: Frame) -> tuple[Any, ...]:
    """What a consumer makes of a frame: a sized mutation, a refusal, or the frame itself."""
    if frame.opcode != Opcode.DcpMutation or frame.magic not in _MUTATION_MAGICS:
        return ("frame", frame)
    try:
        return ("mutation", frame.size, Mutation.decode(frame))
    except CodecError as exc:
        return ("refused", exc.status, exc.message)


def _reference(chunks: list[bytes], limit: int) -> list[tuple[Any, ...]]:
    parser, events = FrameParser(max_value_len=limit), []
    try:
        for chunk in chunks:
            events.extend(_event(frame) for frame in parser.feed(chunk))
    except CodecError as exc:
        events.append(("error", exc.status, exc.message))
    return events


def _fused(chunks: list[bytes], limit: int, feed: Any = feed_mutations) -> list[tuple[Any, ...]]:
    parser, events = FrameParser(max_value_len=limit), []
    try:
        for chunk in chunks:
            for item in feed(parser, chunk):
                if isinstance(item, Frame):
                    events.append(_event(item))
                else:  # (size, mutation), or the fields (size first)
                    events.extend(("mutation", *sized) for sized in item)
    except CodecError as exc:
        events.append(("error", exc.status, exc.message))
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=st.lists(_WIRE, max_size=25),
    cuts=st.lists(st.integers(0, 1 << 14), max_size=10),
    limit=st.sampled_from([20 * 1024 * 1024, 40, 4]),  # small limits: some values refused
)
def test_fused_path_is_parse_plus_decode(frames: list[bytes], cuts: list[int], limit: int) -> None:
    chunks = _split(b"".join(frames), cuts)
    expected = _reference(chunks, limit)
    got = _fused(chunks, limit)
    assert got == expected
    assert all(type(e[2]) is Mutation for e in got if e[0] == "mutation")


def _mutation(seqno: int) -> bytes:
    return Mutation(key=b"k%d" % seqno, value=b"v", by_seqno=seqno, opaque=3).encode()


def test_plain_mutations_come_in_runs_and_others_as_frames() -> None:
    wire = b"".join([_mutation(1), _mutation(2), DcpNoop(opaque=9).encode(), _mutation(3)])
    items = list(feed_mutations(FrameParser(), wire))
    assert [type(i).__name__ for i in items] == ["list", "Frame", "list"]
    first, noop, last = items
    assert isinstance(first, list) and isinstance(noop, Frame) and isinstance(last, list)
    assert [m.by_seqno for _, m in first] == [1, 2] and noop.opcode == Opcode.DcpNoop
    assert [(size, m.by_seqno) for size, m in last] == [(len(_mutation(3)), 3)]


def test_runs_are_bounded_and_none_is_lost() -> None:
    count = RUN_MAX * 2 + 5
    runs = list(feed_mutations(FrameParser(), b"".join(_mutation(i) for i in range(count))))
    assert all(isinstance(r, list) and len(r) <= RUN_MAX for r in runs)
    assert [m.by_seqno for r in runs for _, m in r] == list(range(count))


def test_a_bad_header_after_a_run_is_the_parsers_error() -> None:
    parser = FrameParser()
    items = feed_mutations(parser, _mutation(1) + b"\x42" + bytes(23))
    assert isinstance(next(items), list)
    try:
        next(items)
    except CodecError as exc:
        assert exc.status == Status.Einval
    else:
        raise AssertionError("the bad magic was not refused")


def _fields_of(m: Mutation) -> tuple[Any, ...]:
    return (m.vbucket, bytes(m.key), bytes(m.value), m.by_seqno, m.rev_seqno, m.flags,
            m.expiration, m.cas, m.datatype, m.opaque, m.lock_time, m.nmeta, m.nru)  # fmt: skip


def _as_fields(events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [
        ("mutation", e[1], *_fields_of(e[2])) if isinstance(e[-1], Mutation) else e for e in events
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=st.lists(_WIRE, max_size=25),
    cuts=st.lists(st.integers(0, 1 << 14), max_size=10),
    limit=st.sampled_from([20 * 1024 * 1024, 40, 4]),
)
def test_fields_are_parse_plus_decode(frames: list[bytes], cuts: list[int], limit: int) -> None:
    chunks = _split(b"".join(frames), cuts)
    got = _fused(chunks, limit, feed_fields)
    assert _as_fields(got) == _as_fields(_reference(chunks, limit))
    fused = [e for e in got if e[0] == "mutation" and not isinstance(e[-1], Mutation)]
    assert all(type(e[3]) is bytes and type(e[4]) is bytes for e in fused)


def test_a_run_of_fields_is_left_alone_by_the_garbage_collector() -> None:
    # the inbox holds runs until the application pulls them: tuples of ints and bytes are
    # untracked at the collector's first pass, so they never make a collection longer
    (run,) = feed_fields(FrameParser(), b"".join(_mutation(i) for i in range(1, 9)))
    assert isinstance(run, list) and len(run) == 8
    gc.collect()
    fields: list[MutationFields] = run
    assert not any(gc.is_tracked(f) for f in fields)
