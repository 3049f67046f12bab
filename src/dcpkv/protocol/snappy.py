"""Snappy values (datatype bit 0x02): raw Snappy blocks, as memcached sends and stores them.

Theory of operation
-------------------
A value whose datatype has the Snappy bit is one raw Snappy block (no framing, no checksum:
the block format, not the stream format). The work is done by ``cramjam`` (Rust, maintained,
wheels everywhere); this module adds what the protocol needs around it:

* :func:`inflate` validates as it decompresses: the length the block announces is read first
  and checked against a limit (a 20-byte block may claim gigabytes), then the block is
  decompressed; any corruption is a :class:`CodecError` (Einval) naming the problem, so a
  server refuses the request and stores nothing.
* :func:`deflate_if_smaller` is what a server does for a connection that negotiated Snappy:
  send the compressed form only when it is actually shorter (tiny and random values grow).

Values under :data:`MIN_COMPRESS` bytes are never worth it: Snappy's header and literal tags
make them longer or barely shorter, and the call costs more than the bytes saved.
"""

from __future__ import annotations

import cramjam

from dcpkv.core.status import Status
from dcpkv.protocol.errors import CodecError

SNAPPY = 0x02  # the datatype bit, as a plain int (hot paths test it with &)
MIN_COMPRESS = 32  # bytes below which compressing is not tried

_compress = cramjam.snappy.compress_raw
_decompress = cramjam.snappy.decompress_raw
_announced = cramjam.snappy.decompress_raw_len


def deflate(data: bytes) -> bytes:
    """The raw Snappy block of ``data``."""
    return bytes(_compress(data))


def deflate_if_smaller(data: bytes) -> bytes | None:
    """The compressed form of ``data`` when it is shorter, else None."""
    if len(data) < MIN_COMPRESS:
        return None
    packed = bytes(_compress(data))
    return packed if len(packed) < len(data) else None


def inflate(data: bytes, limit: int) -> bytes:
    """The decompressed bytes of a raw Snappy block; CodecError when it is corrupt (Einval)
    or would decompress to more than ``limit`` bytes (E2big)."""
    try:
        size = _announced(data)
    except Exception as exc:  # cramjam raises its own DecompressionError (and ValueError)
        raise CodecError(Status.Einval, f"Snappy value: corrupt header ({exc})") from None
    if size > limit:
        raise CodecError(Status.E2big, f"Snappy value inflates to {size} bytes, over {limit}")
    try:
        out = bytes(_decompress(data))
    except Exception as exc:
        raise CodecError(Status.Einval, f"Snappy value: corrupt block ({exc})") from None
    if len(out) != size:
        raise CodecError(Status.Einval, "Snappy value: length does not match its header")
    return out
