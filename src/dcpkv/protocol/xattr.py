"""Extended attributes (datatype bit 0x04): the blob in front of a document's body.

Theory of operation
-------------------
A value with the Xattr bit starts with its attributes, then the body::

    u32 total      bytes of the pairs that follow (not counting these 4)
    repeated:
      u32 length   bytes of key + NUL + value + NUL
      key NUL value NUL

all big-endian. A key (X-Key) is 1-16 bytes of UTF-8 that does not start with punctuation
or a control character, except ``_`` (a *system* xattr, which outlives the body in a
tombstone) and ``$`` (a *virtual* xattr, computed by the server and never stored). Any other
key is a *user* xattr, which shares the body's lifetime. A value is one JSON value.

This module only reads and writes that layout: :func:`split` cuts a value into its blob and
body, :func:`decode` reads the blob into an ordered ``{key: json text}`` (validating it: a
malformed blob from a client is a :class:`CodecError`, never stored), :func:`encode` writes
one, :func:`join` puts a blob and a body back together. The rules of who may keep what
(deletions keep system xattrs; a full-document Set drops user ones) are the engine's.
"""

from __future__ import annotations

import json
import struct

from dcpkv.core.status import Status
from dcpkv.protocol.errors import CodecError

XATTR = 0x04  # the datatype bit, as a plain int
MAX_KEY_LEN = 16

_U32 = struct.Struct(">I")
_PUNCT = frozenset("!\"#%&'()*+,-./:;<=>?@[\\]^`{|}~")  # ispunct() but '_' and '$'

Xattrs = dict[str, bytes]  # key -> the value's JSON text, in blob order


def _bad(message: str) -> CodecError:
    return CodecError(Status.Einval, f"xattr blob: {message}")


def key_error(key: str) -> str | None:
    """Why ``key`` is not a valid X-Key, or None."""
    raw = key.encode()
    if not 1 <= len(raw) <= MAX_KEY_LEN:
        return f"key {key!r} must be 1..{MAX_KEY_LEN} bytes"
    first = key[0]
    if first in _PUNCT or not first.isprintable() or first.isspace():
        return f"key {key!r} starts with a reserved character"
    return None


def is_system(key: str) -> bool:
    return key.startswith("_")


def is_virtual(key: str) -> bool:
    return key.startswith("$")


def split(value: bytes) -> tuple[bytes, bytes]:
    """(blob including its length word, body) of a value whose datatype has the Xattr bit."""
    if len(value) < 4:
        raise _bad(f"value of {len(value)} bytes has no length word")
    (total,) = _U32.unpack_from(value)
    end = 4 + total
    if end > len(value):
        raise _bad(f"length {total} runs past the value ({len(value) - 4} bytes)")
    return value[:end], value[end:]


def body_of(value: bytes) -> bytes:
    return split(value)[1]


def decode(blob: bytes) -> Xattrs:
    """The pairs of a blob (as :func:`split` cut it), validated."""
    out: Xattrs = {}
    pos, end = 4, len(blob)
    while pos < end:
        if pos + 4 > end:
            raise _bad("truncated pair length")
        (length,) = _U32.unpack_from(blob, pos)
        pair = blob[pos + 4 : pos + 4 + length]
        if len(pair) != length or length < 4 or pair[-1] != 0 or pair.count(0) != 2:
            raise _bad(f"malformed pair at offset {pos}")
        raw_key, raw_value, _ = pair.split(b"\0")
        key = _text(raw_key)
        problem = key_error(key)
        if problem is not None or is_virtual(key):
            raise _bad(problem or f"virtual key {key!r} cannot be stored")
        if key in out:
            raise _bad(f"key {key!r} appears twice")
        _check_json(raw_value, key)
        out[key] = raw_value
        pos += 4 + length
    return out


def encode(pairs: Xattrs) -> bytes:
    """The blob of ``pairs`` (an empty dict: no blob at all)."""
    if not pairs:
        return b""
    parts = []
    for key, value in pairs.items():
        entry = key.encode() + b"\0" + value + b"\0"
        parts.append(_U32.pack(len(entry)) + entry)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def join(pairs: Xattrs, body: bytes) -> tuple[bytes, bool]:
    """(value, has_xattrs): the blob of ``pairs`` in front of ``body``."""
    blob = encode(pairs)
    return blob + body, bool(blob)


def system_only(pairs: Xattrs) -> Xattrs:
    return {k: v for k, v in pairs.items() if is_system(k)}


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise _bad("key is not UTF-8") from None


def _check_json(raw: bytes, key: str) -> None:
    try:
        json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _bad(f"value of {key!r} is not JSON") from None
