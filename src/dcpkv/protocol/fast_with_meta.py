"""Fused encode of with-meta writes: a replicator's hot path, with no message object between.

Theory of operation
-------------------
An XDCR replicator sends one SetWithMeta or DelWithMeta per replicated change. Building a
:class:`~dcpkv.protocol.kv.SetWithMeta` and encoding it (``Request.encode``: the parts, the
frame checks, the header) costs more than the rest of the change's handling on the
replicator's side. :func:`with_meta_frame` packs the header and the extras in one ``struct``
call and appends the key and the value: the same bytes the message's ``encode`` gives (a
differential test holds them equal), for the one shape a replicator sends:

* magic 0x80 (no framing extras), any with-meta opcode (the quiet ones included);
* extras: flags, expiration, rev seqno, CAS, and the options word when ``options`` is not
  None (24 or 28 bytes; never nmeta: a replicator sends no extended meta);
* the header's CAS 0 (no compare-and-swap), the key within :data:`MAX_KEY_LEN`.
"""

from __future__ import annotations

import struct

from dcpkv.core.status import Status
from dcpkv.protocol.constants import HEADER_LEN, MAX_KEY_LEN, Magic
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import HEADER
from dcpkv.protocol.kv import WITH_META

_U32 = ">I"
_PLAIN = struct.Struct(HEADER.format + WITH_META.format[1:])
_WITH_OPTIONS = struct.Struct(_PLAIN.format + _U32[1:])
_MAGIC = int(Magic.ClientRequest)
_PLAIN_EXTRAS = WITH_META.size
_OPTIONS_EXTRAS = WITH_META.size + 4


def with_meta_frame(
    opcode: int,
    vbucket: int,
    key: bytes,
    value: bytes,
    datatype: int,
    flags: int,
    expiration: int,
    rev_seqno: int,
    meta_cas: int,
    options: int | None,
    opaque: int,
) -> bytes:
    """The frame of a with-meta write (module docstring)."""
    if len(key) > MAX_KEY_LEN:
        raise CodecError(Status.Einval, f"key of {len(key)} bytes exceeds {MAX_KEY_LEN}")
    if options is None:
        body = _PLAIN_EXTRAS + len(key) + len(value)
        head = _PLAIN.pack(
            _MAGIC, opcode, len(key), _PLAIN_EXTRAS, datatype, vbucket, body, opaque, 0,
            flags, expiration, rev_seqno, meta_cas,
        )  # fmt: skip
    else:
        body = _OPTIONS_EXTRAS + len(key) + len(value)
        head = _WITH_OPTIONS.pack(
            _MAGIC, opcode, len(key), _OPTIONS_EXTRAS, datatype, vbucket, body, opaque, 0,
            flags, expiration, rev_seqno, meta_cas, options,
        )  # fmt: skip
    return b"".join((head, key, value))


assert _PLAIN.size == HEADER_LEN + _PLAIN_EXTRAS
