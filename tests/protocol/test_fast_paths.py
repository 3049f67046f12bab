"""The hand-written fast paths of the codec (Get/Set decoding, GetResponse/MutationResponse
encoding) give exactly what the table-driven path gives: the same messages, the same bytes,
the same refusals."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpkv.protocol import FrameParser, kv
from dcpkv.protocol.base import Request, Response
from dcpkv.protocol.constants import Magic
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import Frame, encode_frame
from support.protocol_samples import strategy_for

FAST_DECODE = (kv.Get, kv.GetQ, kv.GetK, kv.GetKQ, kv.Set, kv.SetQ, kv.Add, kv.AddQ,
               kv.Replace, kv.ReplaceQ)  # fmt: skip
FAST_ENCODE = (*kv.GET_RESPONSES.values(), *kv.MUTATION_RESPONSES.values())


def _frame(wire: bytes) -> Frame:
    (frame,) = FrameParser().feed(wire)
    return frame


def _table_decode(cls: type[Request], frame: Frame) -> Request:
    return Request.decode.__func__(cls, frame)  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", FAST_ENCODE, ids=lambda t: t.__name__)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_encode_is_the_table_encode(cls: type[Response], data: st.DataObject) -> None:
    msg = data.draw(strategy_for(cls))
    assert msg.encode() == Response.encode(msg)


@pytest.mark.parametrize("cls", FAST_DECODE, ids=lambda t: t.__name__)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_decode_is_the_table_decode(cls: type[Request], data: st.DataObject) -> None:
    frame = _frame(data.draw(strategy_for(cls)).encode())
    assert cls.decode(frame) == _table_decode(cls, frame)


BAD = [
    ("no key", dict(key=b"", extras=b"\0" * 8)),
    ("short extras", dict(key=b"k", extras=b"\0" * 4)),
    ("extras on a get", dict(key=b"k", extras=b"\0" * 4)),
    ("value on a get", dict(key=b"k", value=b"v")),
]


@pytest.mark.parametrize("cls", [kv.Get, kv.Set], ids=lambda t: t.__name__)
@pytest.mark.parametrize(("case", "parts"), BAD, ids=[b[0] for b in BAD])
def test_fast_decode_refuses_what_the_tables_refuse(
    cls: type[Request], case: str, parts: dict[str, bytes]
) -> None:
    frame = _frame(encode_frame(Magic.ClientRequest, cls.OPCODE, **parts))
    try:
        expected: object = _table_decode(cls, frame)
    except CodecError as exc:
        expected = (exc.status, exc.message)
    try:
        got: object = cls.decode(frame)
    except CodecError as exc:
        got = (exc.status, exc.message)
    assert got == expected


@settings(max_examples=60, deadline=None)
@given(opaque=st.integers(0, 2**32 - 1), cas=st.integers(0, 2**64 - 1))
def test_the_set_success_layout_is_a_set_response(opaque: int, cas: int) -> None:
    """``SET_OK`` (what the server's request fast path answers a Set with) packs the bytes
    of the MutationResponse it stands for."""
    wire = kv.SET_OK.pack(kv.SET_OK_HEAD, opaque, cas)
    assert wire == kv.MutationResponse(opaque=opaque, cas=cas).encode()


def test_out_of_range_fields_are_codec_errors() -> None:
    with pytest.raises(CodecError):
        kv.MutationResponse(opaque=1 << 32).encode()
    with pytest.raises(CodecError):
        kv.GetResponse(flags=-1).encode()
    with pytest.raises(CodecError):
        kv.MutationResponse(vbucket_uuid=1).encode()


_STAT_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=100, deadline=None)
@given(
    opaque=st.integers(0, 2**32 - 1),
    stats=st.lists(
        st.tuples(_STAT_TEXT.filter(bool), st.one_of(_STAT_TEXT, st.integers(0, 2**64 - 1))),
        max_size=20,
    ),
)
def test_a_whole_stat_answer_is_its_messages_bytes(
    opaque: int, stats: list[tuple[str, object]]
) -> None:
    """``kv.encode_stats`` (the server's Stat answers) is the StatResponse messages, encoded
    one by one, the empty one that ends the answer last; and it parses back into them."""
    messages = [kv.StatResponse(opaque=opaque, name=n, value=str(v)) for n, v in stats]
    messages.append(kv.StatResponse(opaque=opaque))
    wire = kv.encode_stats(opaque, stats)
    assert wire == b"".join(m.encode() for m in messages)
    assert [kv.StatResponse.decode(f) for f in FrameParser().feed(wire)] == messages
