"""Every number the wire uses, as enums.

Theory of operation
-------------------
One place for magics, opcodes, datatype bits, HELLO features and the DCP flag sets, all taken
from ``PROTOCOL.md``. Status codes and vbucket states are facts every layer shares, so they
live in the neutral core (:mod:`dcpkv.core.status`, :mod:`dcpkv.core.vbucket`). Values that
identify one thing (an opcode, a magic) are ``IntEnum``; values that combine bits (flags,
datatype) are ``IntFlag`` so ``JSON | XATTR`` stays a member. The codec itself compares plain
ints on the hot path (an ``IntEnum`` member *is* an int), and only converts to enums when
building typed messages.

The DCP barrier
---------------
``Opcode.DcpBarrier`` (0x66) is this project's own extension, the first value after the DCP
range 0x50-0x65. A consumer sends a client request (magic 0x80) whose key is an opaque cookie,
with no extras and no value. The producer answers, once every stream of the connection has
sent everything that was ready when the cookie arrived, with the *same* message as a server
request (magic 0x82): same opcode, same key, same opaque. It lets a consumer wait for "caught
up to now" without polling sequence numbers. A stock server answers it with UnknownCommand,
which a client can use to detect the extension.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

HEADER_LEN = 24
MAX_KEY_LEN = 250
MAX_DCP_NAME_LEN = 200
DEFAULT_MAX_VALUE_LEN = 20 * 1024 * 1024


class Magic(IntEnum):
    ClientRequest = 0x80
    ClientResponse = 0x81
    ServerRequest = 0x82
    ServerResponse = 0x83
    AltClientRequest = 0x08  # "flex": framing extras, one-byte key length
    AltClientResponse = 0x18


REQUEST_MAGICS = frozenset({Magic.ClientRequest, Magic.ServerRequest, Magic.AltClientRequest})
RESPONSE_MAGICS = frozenset({Magic.ClientResponse, Magic.ServerResponse, Magic.AltClientResponse})
FLEX_MAGICS = frozenset({Magic.AltClientRequest, Magic.AltClientResponse})


class Opcode(IntEnum):
    # key-value
    Get = 0x00
    Set = 0x01
    Add = 0x02
    Replace = 0x03
    Delete = 0x04
    Increment = 0x05
    Decrement = 0x06
    Quit = 0x07
    Flush = 0x08
    GetQ = 0x09
    Noop = 0x0A
    Version = 0x0B
    GetK = 0x0C
    GetKQ = 0x0D
    Append = 0x0E
    Prepend = 0x0F
    Stat = 0x10
    SetQ = 0x11
    AddQ = 0x12
    ReplaceQ = 0x13
    DeleteQ = 0x14
    Touch = 0x1C
    GAT = 0x1D
    Hello = 0x1F
    SaslListMechs = 0x20
    SaslAuth = 0x21
    SaslStep = 0x22
    SetVbucket = 0x3D
    GetVbucket = 0x3E
    DelVbucket = 0x3F
    GetAllVbSeqnos = 0x48
    SelectBucket = 0x89
    ObserveSeqno = 0x91
    GetMeta = 0xA0
    GetqMeta = 0xA1
    SetWithMeta = 0xA2
    SetqWithMeta = 0xA3
    AddWithMeta = 0xA4
    AddqWithMeta = 0xA5
    DelWithMeta = 0xA8
    DelqWithMeta = 0xA9
    # sub-document (the single-path ops, then the multi-path ones)
    SubdocGet = 0xC5
    SubdocExists = 0xC6
    SubdocDictAdd = 0xC7
    SubdocDictUpsert = 0xC8
    SubdocDelete = 0xC9
    SubdocReplace = 0xCA
    SubdocArrayPushLast = 0xCB
    SubdocArrayPushFirst = 0xCC
    SubdocArrayInsert = 0xCD
    SubdocArrayAddUnique = 0xCE
    SubdocCounter = 0xCF
    SubdocMultiLookup = 0xD0
    SubdocMultiMutation = 0xD1
    SubdocGetCount = 0xD2
    SetClusterConfig = 0xB4
    SeqnoPersistence = 0xB7
    GetClusterConfig = 0xB5
    # kv_engine's "reload the RBAC database" (there ns_server writes the file first); here
    # the manager is remote, so the request carries the users document itself
    RbacRefresh = 0xF7
    GetErrorMap = 0xFE
    # DCP
    DcpOpen = 0x50
    DcpAddStream = 0x51
    DcpCloseStream = 0x52
    DcpStreamRequest = 0x53
    DcpGetFailoverLog = 0x54
    DcpStreamEnd = 0x55
    DcpSnapshotMarker = 0x56
    DcpMutation = 0x57
    DcpDeletion = 0x58
    DcpExpiration = 0x59
    DcpFlush = 0x5A  # retired upstream; kept so the range is complete, never decoded
    DcpSetVbucketState = 0x5B
    DcpNoop = 0x5C
    DcpBufferAck = 0x5D
    DcpControl = 0x5E
    DcpSystemEvent = 0x5F
    DcpPrepare = 0x60
    DcpSeqnoAcknowledged = 0x61
    DcpCommit = 0x62
    DcpAbort = 0x63
    DcpSeqnoAdvanced = 0x64
    DcpOsoSnapshot = 0x65
    DcpBarrier = 0x66  # this project's extension, see the module docstring


class ServerOpcode(IntEnum):
    """Opcodes of server requests (magic 0x82): their own space, apart from :class:`Opcode`."""

    ClustermapChangeNotification = 0x01


class Datatype(IntFlag):
    """Bits of header byte 5. A flag set, not an enum: JSON | Snappy is a legal value."""

    Raw = 0x00
    JSON = 0x01
    Snappy = 0x02
    Xattr = 0x04


class HelloFeature(IntEnum):
    Datatype = 0x01
    TcpNoDelay = 0x03
    MutationSeqno = 0x04
    Xattr = 0x06
    Xerror = 0x07
    SelectBucket = 0x08
    Snappy = 0x0A
    JSON = 0x0B
    Duplex = 0x0C
    ClustermapChangeNotification = 0x0D
    UnorderedExecution = 0x0E
    Tracing = 0x0F
    AltRequestSupport = 0x10
    SyncReplication = 0x11
    Collections = 0x12


class StreamEndReason(IntEnum):
    OK = 0
    Closed = 1
    StateChanged = 2
    Disconnected = 3
    TooSlow = 4
    BackfillFailed = 5
    Rollback = 6
    FilterEmpty = 7
    LostPrivileges = 8


class OpenFlag(IntFlag):
    Consumer = 0x00
    Producer = 0x01
    IncludeXattrs = 0x04
    NoValue = 0x08
    IncludeDeleteTimes = 0x20
    NoValueWithUnderlyingDatatype = 0x40
    IncludeDeletedUserXattrs = 0x100
    SkipDeletesInInitialBackfill = 0x200


class StreamRequestFlag(IntFlag):
    TakeOver = 0x01
    DiskOnly = 0x02
    ToLatest = 0x04
    ActiveVbOnly = 0x10
    StrictVbUuid = 0x20
    FromLatest = 0x40
    IgnorePurgedTombstones = 0x80


class SnapshotFlag(IntFlag):
    Memory = 0x01
    Disk = 0x02
    Checkpoint = 0x04
    Ack = 0x08
    History = 0x10
    MayContainDuplicateKeys = 0x20


class OsoSnapshotFlag(IntFlag):
    Start = 0x01
    End = 0x02


class SnapshotMarkerVersion(IntEnum):
    """The version byte of a V2 snapshot marker's one-byte extras (0x01 was never used)."""

    V2_0 = 0x00
    V2_2 = 0x02


class FramingId(IntEnum):
    """Framing-extras item ids we understand (requests and responses number them apart)."""

    RequestDurability = 1
    RequestDcpStreamId = 2
    ResponseServerDuration = 0


class DurabilityLevel(IntEnum):
    """The level byte of a request's durability requirement (0 is never valid on the wire)."""

    Majority = 1
    MajorityAndPersistToActive = 2
    PersistToMajority = 3
