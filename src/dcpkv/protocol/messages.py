"""``decode_message``: from a parsed :class:`Frame` to its typed message.

Theory of operation
-------------------
Dispatch is two dictionary lookups built once at import:

* requests (magic 0x80 / 0x08) by opcode: a message type's ``decode`` or, for opcodes with
  several layouts, a function that picks the type (snapshot markers, deletions);
* server requests (magic 0x82) by opcode: ClustermapChangeNotification and the echoed
  :class:`DcpBarrier`;
* responses (magic 0x81 / 0x18 / 0x83) by (opcode, status): a typed response when that status
  has a typed body (StreamRequest has two: Success and Rollback), else
  :class:`GenericResponse`, which reads any response raw.

An opcode with no request type raises ``CodecError(UnknownCommand)``: exactly what a server
should answer. Nothing but :class:`CodecError` leaves this module.
"""

from __future__ import annotations

from collections.abc import Callable

from dcpkv.core.status import Status
from dcpkv.protocol import dcp, kv
from dcpkv.protocol.base import GenericResponse, Message, opcode_name
from dcpkv.protocol.constants import Magic
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import Frame

Decoder = Callable[[Frame], Message]


def _request_table() -> dict[int, Decoder]:
    table: dict[int, Decoder] = {
        t.OPCODE: t.decode for t in (*kv.REQUEST_TYPES, *dcp.REQUEST_TYPES)
    }
    table.update(dcp.REQUEST_DECODERS.items())  # pairs: an Opcode key is an int key
    return table


def _response_table() -> dict[tuple[int, int], Decoder]:
    table: dict[tuple[int, int], Decoder] = {}
    for t in (*kv.RESPONSE_TYPES, *dcp.RESPONSE_TYPES):
        for status in t.STATUSES:
            table[(t.OPCODE, status)] = t.decode
    return table


_REQUESTS = _request_table()
_SERVER_REQUESTS: dict[int, Decoder] = {
    t.OPCODE: t.decode for t in (*kv.SERVER_REQUEST_TYPES, *dcp.SERVER_REQUEST_TYPES)
}
_RESPONSES = _response_table()
_CLIENT_REQUEST_MAGICS = frozenset({Magic.ClientRequest, Magic.AltClientRequest})


def decode_message(frame: Frame) -> Message:
    """The typed message in ``frame``; ``CodecError`` if it is malformed or unknown."""
    magic = frame.magic
    if magic in _CLIENT_REQUEST_MAGICS:
        decoder = _REQUESTS.get(frame.opcode)
    elif magic == Magic.ServerRequest:
        decoder = _SERVER_REQUESTS.get(frame.opcode)
    else:
        decoder = _RESPONSES.get((frame.opcode, frame.status), GenericResponse.decode)
    if decoder is None:
        raise CodecError(
            Status.UnknownCommand,
            f"opcode {opcode_name(frame.opcode)} (magic 0x{magic:02x}) has no message type",
        )
    return decoder(frame)
