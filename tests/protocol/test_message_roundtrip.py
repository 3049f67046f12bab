"""Every message type survives encode -> FrameParser -> decode_message, by example (a table
of hand-written instances) and by property (hypothesis, full u64 ranges)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpkv.protocol import FrameParser, GenericResponse, Message, decode_message
from dcpkv.protocol.dcp import StreamRequestOk
from support.protocol_samples import ALL_TYPES, EXAMPLES, strategy_for


def _roundtrip(msg: Message) -> Message:
    wire = msg.encode()
    frames = list(FrameParser().feed(wire))
    assert len(frames) == 1
    assert frames[0].size == len(wire)
    return decode_message(frames[0])


def test_every_type_has_an_example() -> None:
    covered = {type(m) for m in EXAMPLES}
    missing = [t.__name__ for t in ALL_TYPES if t not in covered]
    assert not missing


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_example_roundtrip(msg: Message) -> None:
    decoded = _roundtrip(msg)
    assert type(decoded) is type(msg)
    assert decoded == msg
    assert decoded.encode() == msg.encode()


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda t: t.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_roundtrip(cls: type[Message], data: st.DataObject) -> None:
    msg = data.draw(strategy_for(cls))
    if cls is GenericResponse:
        # the dispatcher hands (opcode, status) pairs with a typed body to the typed class
        decoded = GenericResponse.decode(next(FrameParser().feed(msg.encode())))
    else:
        decoded = _roundtrip(msg)
    assert type(decoded) is cls
    assert decoded == msg


def test_decoded_bytes_are_zero_copy_views() -> None:
    from dcpkv.protocol.dcp import Mutation

    wire = Mutation(key=b"key", value=b"value", by_seqno=1).encode()
    decoded = decode_message(next(FrameParser().feed(wire)))
    assert isinstance(decoded, Mutation)
    assert isinstance(decoded.value, memoryview)
    assert decoded.value.obj is wire  # a slice of the very bytes fed in
    assert decoded.value.readonly


def test_stream_request_ok_reuses_failover_table_wire_format() -> None:
    from dcpkv.core.failover_table import FailoverEntry, encode_wire

    log = (FailoverEntry(0xAA, 10), FailoverEntry(0xBB, 0))
    wire = StreamRequestOk(failover_log=log).encode()
    assert wire[24:] == encode_wire(log)


# -- the producer's fast encoders give the typed messages' bytes --------------------------------


@pytest.mark.parametrize("cas", [0, 1, (1 << 63) + 5, (1 << 64) - 1])
def test_fast_mutation_encoders_match_the_typed_message(cas: int) -> None:
    from dcpkv.protocol import dcp as d

    fields = {
        "opaque": 0xFFFFFFFF,
        "vbucket": 1023,
        "cas": cas,
        "by_seqno": (1 << 64) - 2,
        "rev_seqno": 3,
        "flags": 0xDEADBEEF,
        "expiration": 2_000_000_000,
        "datatype": 7,
    }
    typed = d.Mutation(key=b"k" * 250, value=b"v" * 300, **fields).encode()  # fmt: skip
    assert d.encode_mutation(**fields, key=b"k" * 250, value=b"v" * 300) == typed
    signed = cas - (1 << 64) if cas >= 1 << 63 else cas
    head = d.MUTATION_HEAD_S64.pack(
        0x80, 0x57, 250, 31, 7, 1023, 31 + 250 + 300, 0xFFFFFFFF, signed, (1 << 64) - 2, 3,
        0xDEADBEEF, 2_000_000_000, 0, 0, 0,
    )  # fmt: skip
    assert head + b"k" * 250 + b"v" * 300 == typed


def test_fast_snapshot_marker_matches_the_typed_message() -> None:
    from dcpkv.protocol import dcp as d

    typed = d.SnapshotMarker(opaque=9, vbucket=5, start_seqno=1, end_seqno=(1 << 64) - 1,
                             flags=0x0B).encode()  # fmt: skip
    assert d.encode_snapshot_marker(9, 5, 1, (1 << 64) - 1, 0x0B) == typed
