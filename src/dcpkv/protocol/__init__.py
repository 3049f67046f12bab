"""The memcached binary protocol and DCP, as a sans-I/O codec (no sockets in here).

Theory of operation
-------------------
Bytes in: :class:`FrameParser` cuts a byte stream into :class:`Frame` objects (header fields
plus memoryview slices of the body), then :func:`decode_message` turns a frame into a typed
message (``kv`` and ``dcp`` modules). Bytes out: every typed message has ``encode()``; raw
frames can be built with :func:`encode_frame`. Anything malformed raises :class:`CodecError`
carrying the status a server should answer. The modules, one concept each:

``constants``  magics, opcodes, flags, datatypes     ``frame``     header, framing, parser
``errors``     CodecError                             ``base``      typed-message machinery
``kv``         key-value messages                     ``dcp``       DCP messages
``messages``   decode_message dispatcher             ``fast_dcp``  fused parse+decode of mutations
"""

from dcpkv.protocol.base import GenericResponse, Message, Request, Response
from dcpkv.protocol.constants import (
    DEFAULT_MAX_VALUE_LEN,
    HEADER_LEN,
    MAX_KEY_LEN,
    Datatype,
    HelloFeature,
    Magic,
    Opcode,
    OpenFlag,
    OsoSnapshotFlag,
    SnapshotFlag,
    StreamEndReason,
    StreamRequestFlag,
)
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import Frame, FrameParser, encode_frame
from dcpkv.protocol.messages import decode_message

__all__ = [
    "DEFAULT_MAX_VALUE_LEN",
    "HEADER_LEN",
    "MAX_KEY_LEN",
    "CodecError",
    "Datatype",
    "Frame",
    "FrameParser",
    "GenericResponse",
    "HelloFeature",
    "Magic",
    "Message",
    "Opcode",
    "OpenFlag",
    "OsoSnapshotFlag",
    "Request",
    "Response",
    "SnapshotFlag",
    "StreamEndReason",
    "StreamRequestFlag",
    "decode_message",
    "encode_frame",
]
