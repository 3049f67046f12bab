"""Status codes and what they mean to a client: the facts behind the error map.

Theory of operation
-------------------
Every response carries a status (``PROTOCOL.md``). A client needs to know more than its
number: may it send the request again, now or later; must it refresh its cluster map first
(NotMyVbucket: the vbucket lives elsewhere now); is the connection still usable. Couchbase
publishes these facts as the *error map* (GetErrorMap, negotiated with Xerror): per status a
name, a description and attributes such as ``retry-now``, ``retry-later``, ``fetch-config``,
``conn-state-invalidated``. They are written down once, here, in :data:`ERROR_MAP`: the server
serves it, and every client decides from it (:func:`retryable`, :func:`refreshes_map`) instead
of keeping its own list. Only the statuses this server answers have an entry; the others
have no attributes (never retried).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum


class Status(IntEnum):
    Success = 0x00
    KeyEnoent = 0x01
    KeyEexists = 0x02
    E2big = 0x03
    Einval = 0x04
    NotStored = 0x05
    DeltaBadval = 0x06
    NotMyVbucket = 0x07
    NoBucket = 0x08
    Locked = 0x09
    DcpStreamNotFound = 0x0A
    OpaqueNoMatch = 0x0B
    AuthError = 0x20
    AuthContinue = 0x21
    Erange = 0x22
    Rollback = 0x23
    Eaccess = 0x24
    NotInitialized = 0x25
    UnknownCommand = 0x81
    Enomem = 0x82
    NotSupported = 0x83
    Einternal = 0x84
    Ebusy = 0x85
    Etmpfail = 0x86
    DcpStreamIdInvalid = 0x8D
    DurabilityInvalidLevel = 0xA0
    DurabilityImpossible = 0xA1
    SyncWriteInProgress = 0xA2
    SyncWriteAmbiguous = 0xA3
    SyncWriteReCommitInProgress = 0xA4
    # sub-document (Couchbase's SubDocument.md)
    SubdocPathEnoent = 0xC0
    SubdocPathMismatch = 0xC1
    SubdocPathEinval = 0xC2
    SubdocPathE2big = 0xC3
    SubdocDocE2deep = 0xC4
    SubdocValueCantinsert = 0xC5
    SubdocDocNotJson = 0xC6
    SubdocNumErange = 0xC7
    SubdocDeltaEinval = 0xC8
    SubdocPathEexists = 0xC9
    SubdocValueEtoodeep = 0xCA
    SubdocInvalidCombo = 0xCB
    SubdocMultiPathFailure = 0xCC
    SubdocSuccessDeleted = 0xCD
    SubdocXattrInvalidFlagCombo = 0xCE
    SubdocXattrInvalidKeyCombo = 0xCF
    SubdocXattrUnknownMacro = 0xD0
    SubdocXattrUnknownVattr = 0xD1
    SubdocXattrCantModifyVattr = 0xD2
    SubdocMultiPathFailureDeleted = 0xD3
    SubdocInvalidXattrOrder = 0xD4


class ErrorAttribute(StrEnum):
    """The error map's attribute names (Couchbase's ``ErrorMap.md``), the ones we use."""

    SUCCESS = "success"
    ITEM_ONLY = "item-only"
    INVALID_INPUT = "invalid-input"
    FETCH_CONFIG = "fetch-config"
    CONN_STATE_INVALIDATED = "conn-state-invalidated"
    AUTH = "auth"
    SUPPORT = "support"
    SPECIAL_HANDLING = "special-handling"
    TEMP = "temp"
    INTERNAL = "internal"
    RETRY_NOW = "retry-now"
    RETRY_LATER = "retry-later"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """One status in the error map: its description and attributes, in the map's order."""

    desc: str
    attrs: tuple[ErrorAttribute, ...]


def _info(desc: str, *attrs: str) -> ErrorInfo:
    return ErrorInfo(desc, tuple(ErrorAttribute(a) for a in attrs))


ERROR_MAP: dict[Status, ErrorInfo] = {
    Status.Success: _info("Success", "success"),
    Status.KeyEnoent: _info("Not found", "item-only"),
    Status.KeyEexists: _info("CAS mismatch or key exists", "item-only"),
    Status.E2big: _info("Value or key too large", "invalid-input"),
    Status.Einval: _info("Invalid arguments", "invalid-input"),
    Status.NotStored: _info("Not stored", "item-only"),
    Status.DeltaBadval: _info("Value is not a number", "item-only", "invalid-input"),
    Status.NotMyVbucket: _info("Vbucket not on this node", "fetch-config", "invalid-input"),
    Status.NoBucket: _info("No bucket selected", "conn-state-invalidated"),
    Status.DcpStreamNotFound: _info("No such DCP stream", "invalid-input"),
    Status.AuthError: _info("Authentication failed", "auth", "conn-state-invalidated"),
    Status.AuthContinue: _info("Authentication continues", "auth", "support"),
    Status.Erange: _info("Range error", "invalid-input"),
    Status.Rollback: _info("Rollback required", "special-handling"),
    Status.Eaccess: _info("No access", "auth", "conn-state-invalidated"),
    Status.NotInitialized: _info("Not initialized", "conn-state-invalidated", "retry-later"),
    Status.UnknownCommand: _info("Unknown command", "support", "invalid-input"),
    Status.Enomem: _info("Out of memory", "temp", "retry-later"),
    Status.NotSupported: _info("Not supported", "support"),
    Status.Einternal: _info("Internal error", "internal"),
    Status.Ebusy: _info("Busy", "temp", "retry-now"),
    Status.Etmpfail: _info("Temporary failure", "temp", "retry-later"),
    Status.DcpStreamIdInvalid: _info("DCP stream id missing or not expected", "invalid-input"),
    Status.DurabilityInvalidLevel: _info("Invalid durability level", "invalid-input"),
    Status.DurabilityImpossible: _info("Durability requirement cannot be met", "item-only"),
    Status.SyncWriteInProgress: _info(
        "A durable write is pending on the key", "item-only", "temp", "retry-later"
    ),
    Status.SyncWriteAmbiguous: _info(
        "The durable write's outcome is unknown", "item-only", "special-handling"
    ),
    Status.SyncWriteReCommitInProgress: _info(
        "A durable write on the key is being re-committed", "item-only", "temp", "retry-later"
    ),
    Status.SubdocPathEnoent: _info("Sub-document path does not exist", "item-only"),
    Status.SubdocPathMismatch: _info("Sub-document path mismatch", "item-only"),
    Status.SubdocPathEinval: _info("Invalid sub-document path", "invalid-input"),
    Status.SubdocPathE2big: _info("Sub-document path too long", "invalid-input"),
    Status.SubdocDocE2deep: _info("Document too deep to parse", "item-only"),
    Status.SubdocValueCantinsert: _info("Value cannot be inserted", "invalid-input"),
    Status.SubdocDocNotJson: _info("Document is not JSON", "item-only"),
    Status.SubdocNumErange: _info("Number out of range", "item-only"),
    Status.SubdocDeltaEinval: _info("Invalid delta", "invalid-input"),
    Status.SubdocPathEexists: _info("Sub-document path exists", "item-only"),
    Status.SubdocValueEtoodeep: _info("Value would make the document too deep", "invalid-input"),
    Status.SubdocInvalidCombo: _info("Invalid combination of commands", "invalid-input"),
    Status.SubdocMultiPathFailure: _info("One or more paths failed", "item-only"),
    Status.SubdocSuccessDeleted: _info("Success on a deleted document", "success"),
    Status.SubdocXattrInvalidFlagCombo: _info("Invalid xattr flag combination", "invalid-input"),
    Status.SubdocXattrInvalidKeyCombo: _info("Invalid xattr key combination", "invalid-input"),
    Status.SubdocXattrUnknownMacro: _info("Unknown xattr macro", "invalid-input"),
    Status.SubdocXattrUnknownVattr: _info("Unknown virtual xattr", "invalid-input"),
    Status.SubdocXattrCantModifyVattr: _info("Virtual xattrs cannot be modified", "invalid-input"),
    Status.SubdocMultiPathFailureDeleted: _info("Paths failed on a deleted document", "item-only"),
    Status.SubdocInvalidXattrOrder: _info("Xattr paths must come first", "invalid-input"),
}
# Looked up by plain int too: a frame's status field is not converted to the enum on the hot path.
_BY_CODE: dict[int, ErrorInfo] = {int(status): info for status, info in ERROR_MAP.items()}


def status_name(status: int) -> str:
    """``NotMyVbucket`` for a status we know, ``0x2a`` for one we do not."""
    try:
        return Status(status).name
    except ValueError:
        return f"0x{status:02x}"


def attributes(status: int) -> frozenset[ErrorAttribute]:
    """The error-map attributes of ``status`` (none for a status the map does not list)."""
    info = _BY_CODE.get(status)
    return frozenset(info.attrs) if info is not None else frozenset()


def refreshes_map(status: int) -> bool:
    """The request went to the wrong node: refresh the cluster map, then send it again."""
    return ErrorAttribute.FETCH_CONFIG in attributes(status)


def retryable(status: int) -> bool:
    """The same request may succeed if sent again on this connection: the failure was
    temporary (``retry-now``/``retry-later``, the connection still usable) or the cluster map
    moved (``fetch-config``)."""
    attrs = attributes(status)
    if ErrorAttribute.CONN_STATE_INVALIDATED in attrs:
        return False
    retry = ErrorAttribute.RETRY_NOW in attrs or ErrorAttribute.RETRY_LATER in attrs
    return retry or ErrorAttribute.FETCH_CONFIG in attrs
