"""The fused with-meta encoder against the codec's messages: the same bytes for every shape a
replicator sends, and the codec's refusal of a key too long."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.protocol import kv
from dcpkv.protocol.constants import MAX_KEY_LEN
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.fast_with_meta import with_meta_frame

U32, U64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
MESSAGES = [kv.SetWithMeta, kv.SetqWithMeta, kv.AddWithMeta, kv.DelWithMeta, kv.DelqWithMeta]


@given(
    st.sampled_from(MESSAGES), st.integers(0, 1023), st.binary(min_size=1, max_size=MAX_KEY_LEN),
    st.binary(max_size=300), st.integers(0, 255), U32, U32, U64, U64, st.none() | U32, U32,
)  # fmt: skip
def test_the_same_bytes_as_the_message(
    cls: type[kv.SetWithMeta], vbucket: int, key: bytes, value: bytes, datatype: int,
    flags: int, expiration: int, rev: int, cas: int, options: int | None, opaque: int,
) -> None:  # fmt: skip
    message = cls(
        vbucket=vbucket, key=key, value=value, datatype=datatype, flags=flags,
        expiration=expiration, rev_seqno=rev, meta_cas=cas, options=options, opaque=opaque,
    )  # fmt: skip
    fused = with_meta_frame(
        int(cls.OPCODE), vbucket, key, value, datatype, flags, expiration, rev, cas, options,
        opaque,
    )  # fmt: skip
    assert fused == message.encode()


def test_a_key_too_long_is_refused_as_the_codec_refuses_it() -> None:
    key = b"k" * (MAX_KEY_LEN + 1)
    with pytest.raises(CodecError):
        kv.SetWithMeta(key=key).encode()
    with pytest.raises(CodecError, match="exceeds"):
        with_meta_frame(int(kv.SetWithMeta.OPCODE), 0, key, b"", 0, 0, 0, 0, 0, None, 1)
