"""Sub-document lookups and mutations on one document (sans-I/O).

Theory of operation
-------------------
A request carries up to 16 *specs* (opcode, path flags, path, value) and *doc flags*; this
module applies them to one stored :class:`Item` (or to nothing: the document is missing) and
says what to answer and what to store. It never touches a vbucket: :mod:`dcpkv.engine.vbucket`
calls :func:`mutate` under its lock with the CAS and seqno the mutation will get, so a
multi-path mutation is one atomic change (one seqno, one DCP mutation) or nothing at all.

The document is seen as two roots: the body (parsed on first use; a body that is not JSON
answers DocNotJson to body paths) and the xattrs (each value parsed). A path with the Xattr
flag addresses the xattrs: its first component is the X-Key. Keys starting with ``$`` are
*virtual* xattrs computed from the item's metadata (``$document``, ``$XTOC``, ``$vbucket``):
readable, never writable (XattrCantModifyVattr), unknown ones XattrUnknownVattr.

Request-level rules, checked before anything is applied (a whole-request status):

=============================== ============================================================
1..16 specs of the right kind   else SubdocInvalidCombo
xattr specs before body specs   else SubdocInvalidXattrOrder
ExpandMacros only with Xattr    else SubdocXattrInvalidFlagCombo
Mkdoc and Add together, Add     Einval
with a CAS
missing document                KeyEnoent, unless Mkdoc / Add (then an empty object, or an
                                empty array when the first body spec pushes at the root)
Add over a live document        KeyEexists
CAS given and different         KeyEexists
deleted document                KeyEnoent, unless AccessDeleted: lookups read its xattrs
                                (status SuccessDeleted), xattr-only mutations keep it deleted
=============================== ============================================================

Macros (with ExpandMacros, inside an xattr value): ``"${Mutation.CAS}"`` becomes the new CAS
as ``"0x"`` and the 8 bytes of the CAS in little-endian order in hex, ``"${Mutation.seqno}"``
the new seqno as 16 hex digits, ``"${Mutation.value_crc32c}"`` the CRC-32C of the new body as
8 hex digits (as Couchbase's clients decode them). They are placeholders until the body is
final, so the CRC covers the body the mutation stores.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import crc32c

from dcpkv.core.status import Status
from dcpkv.engine import document, subjson
from dcpkv.engine.item import EngineError, Item
from dcpkv.engine.subjson import PathError
from dcpkv.protocol import xattr
from dcpkv.protocol.constants import Opcode
from dcpkv.protocol.subdoc import Spec

MAX_SPECS = 16
# path flags
MKDIR_P, XATTR_PATH, EXPAND_MACROS = 0x01, 0x04, 0x10
# doc flags
MKDOC, ADD, ACCESS_DELETED = 0x01, 0x02, 0x04

LOOKUP_OPS = frozenset({Opcode.Get, Opcode.SubdocGet, Opcode.SubdocExists, Opcode.SubdocGetCount})
MUTATION_OPS = frozenset({
    Opcode.Set, Opcode.Delete, Opcode.SubdocDictAdd, Opcode.SubdocDictUpsert,
    Opcode.SubdocDelete, Opcode.SubdocReplace, Opcode.SubdocArrayPushLast,
    Opcode.SubdocArrayPushFirst, Opcode.SubdocArrayInsert, Opcode.SubdocArrayAddUnique,
    Opcode.SubdocCounter,
})  # fmt: skip
_MACRO = re.compile(rb'"\$\{([^}"]*)\}"')
_MACROS = {b"Mutation.CAS": "cas", b"Mutation.seqno": "seqno", b"Mutation.value_crc32c": "crc"}
_SENTINEL = "\0macro:{}\0"


@dataclass(frozen=True, slots=True)
class Result:
    status: Status
    value: bytes = b""


class SubdocError(EngineError):
    """A whole-request failure (the document, the doc flags, the set of specs)."""

    def __init__(self, status: Status, message: str = "") -> None:
        super().__init__(message or status.name)
        self.status = status


class SpecFailed(EngineError):
    """Spec ``index`` of a mutation failed with ``status``: nothing is stored."""

    def __init__(self, index: int, status: Status) -> None:
        super().__init__(f"spec {index}: {status.name}")
        self.index = index
        self.status = status


@dataclass(slots=True)
class Mutated:
    """What to store: value, datatype, flags, deleted; and the specs' result values."""

    value: bytes
    datatype: int
    flags: int
    deleted: bool
    results: list[tuple[int, bytes]] = field(default_factory=list)


# -- the request-level checks ------------------------------------------------------------------


def check_specs(specs: list[Spec], allowed: frozenset[Opcode]) -> None:
    if not 1 <= len(specs) <= MAX_SPECS or any(s.opcode not in allowed for s in specs):
        raise SubdocError(Status.SubdocInvalidCombo, f"1..{MAX_SPECS} specs of the right kind")
    seen_body = False
    for s in specs:
        if s.flags & EXPAND_MACROS and not s.is_xattr:
            raise SubdocError(Status.SubdocXattrInvalidFlagCombo, "macros only in xattrs")
        if s.is_xattr and seen_body:
            raise SubdocError(Status.SubdocInvalidXattrOrder, "xattr paths must come first")
        seen_body = seen_body or not s.is_xattr


def _existing(current: Item | None, doc_flags: int) -> Item | None:
    """The document to work on (a tombstone only with AccessDeleted), or None (missing)."""
    if current is None or (current.deleted and not doc_flags & ACCESS_DELETED):
        return None
    return current


# -- the document being worked on --------------------------------------------------------------


class _Doc:
    """A document's two roots, parsed on demand, and what changed."""

    def __init__(self, item: Item | None, empty_root: Any = None) -> None:
        self.item = item
        if item is None:
            self.raw_body, self.json_body = b"", True
            self.xattrs: dict[str, Any] = {}
            self.body: Any = {} if empty_root is None else empty_root
            self.parsed = True
        else:
            doc = document.unpack(item.value or b"", item.datatype)
            self.raw_body, self.json_body = doc.body, doc.json or item.deleted
            self.xattrs = {k: json.loads(v) for k, v in doc.xattrs.items()}
            self.body, self.parsed = None, False
        self.body_changed = self.xattrs_changed = False

    def root(self) -> Any:
        if not self.parsed:
            try:
                self.body = json.loads(self.raw_body) if self.raw_body else None
            except (ValueError, UnicodeDecodeError):
                raise PathError(Status.SubdocDocNotJson, "the document is not JSON") from None
            if self.body is None and (self.item is None or self.item.deleted):
                raise PathError(Status.SubdocPathEnoent, "a deleted document has no body")
            self.parsed = True
        return self.body


def _xattr_path(spec: Spec, *, write: bool) -> subjson.Path:
    path = subjson.parse_path(spec.path)
    if not path or not isinstance(path[0], str):
        raise PathError(Status.SubdocPathEinval, "an xattr path starts with its key")
    key = path[0]
    if xattr.is_virtual(key):
        if write:
            raise PathError(Status.SubdocXattrCantModifyVattr, f"{key} is read-only")
    elif xattr.key_error(key) is not None:
        raise PathError(Status.SubdocPathEinval, xattr.key_error(key) or "")
    return path


# -- lookups -----------------------------------------------------------------------------------


def lookup(
    current: Item | None,
    specs: list[Spec],
    doc_flags: int,
    vattrs: Callable[[Item], dict[str, Any]],
) -> tuple[Status, list[Result]]:
    """(overall status, one result per spec); SubdocError for a whole-request failure."""
    check_specs(specs, LOOKUP_OPS)
    item = _existing(current, doc_flags)
    if item is None:
        raise SubdocError(Status.KeyEnoent, "no such document")
    doc = _Doc(item)
    results = [_lookup_one(doc, s, vattrs) for s in specs]
    failed = any(r.status != Status.Success for r in results)
    if item.deleted:
        return (
            Status.SubdocMultiPathFailureDeleted if failed else Status.SubdocSuccessDeleted
        ), results
    return (Status.SubdocMultiPathFailure if failed else Status.Success), results


def _lookup_one(doc: _Doc, spec: Spec, vattrs: Callable[[Item], dict[str, Any]]) -> Result:
    try:
        if spec.opcode == Opcode.Get:  # the whole body, JSON or not
            if spec.path or spec.is_xattr:
                raise PathError(Status.SubdocPathEinval, "a full-document get takes no path")
            return Result(Status.Success, doc.raw_body)
        if spec.is_xattr:
            path = _xattr_path(spec, write=False)
            key = str(path[0])
            virtual = xattr.is_virtual(key)
            root: Any = vattrs(doc.item) if virtual and doc.item is not None else doc.xattrs
            if virtual and key not in root:
                raise PathError(Status.SubdocXattrUnknownVattr, f"no virtual xattr {key}")
        else:
            path, root = subjson.parse_path(spec.path), doc.root()
        return _read(spec.opcode, root, path)
    except PathError as exc:
        return Result(exc.status)


def _read(opcode: int, root: Any, path: subjson.Path) -> Result:
    if opcode == Opcode.SubdocGetCount:
        return Result(Status.Success, b"%d" % subjson.count(root, path))
    value = subjson.get(root, path)
    if opcode == Opcode.SubdocExists:
        return Result(Status.Success)
    return Result(Status.Success, subjson.dumps(value))


def document_vattr(item: Item, vbucket_uuid: int) -> dict[str, Any]:
    """The ``$document`` virtual xattr (and ``$XTOC``, ``$vbucket``) of an item."""
    doc = document.unpack(item.value or b"", item.datatype)
    names = [n for n, bit in (("json", 1), ("snappy", 2), ("xattr", 4)) if item.datatype & bit]
    return {
        "$document": {
            "CAS": cas_hex(item.cas),
            "vbucket_uuid": f"0x{vbucket_uuid:016x}",
            "seqno": f"0x{item.by_seqno:016x}",
            "revid": str(item.rev_seqno),
            "exptime": item.expiry,
            "flags": item.flags,
            "value_bytes": len(doc.body),
            "value_crc32c": f"0x{crc32c.crc32c(doc.body):08x}",
            "deleted": item.deleted,
            "datatype": names or ["raw"],
            "last_modified": str(item.cas // 1_000_000_000),
        },
        "$XTOC": list(doc.xattrs),
        "$vbucket": {"HLC": {"now": str(item.cas // 1_000_000_000), "mode": "real"}},
    }


def cas_hex(cas: int) -> str:
    return "0x" + struct.pack("<Q", cas).hex()


# -- mutations ---------------------------------------------------------------------------------


def mutate(
    current: Item | None, specs: list[Spec], doc_flags: int, cas: int, new_cas: int,
    new_seqno: int,
) -> Mutated:  # fmt: skip
    """What the mutation stores; SubdocError / SpecFailed when it stores nothing."""
    check_specs(specs, MUTATION_OPS)
    item = _check_document(current, specs, doc_flags, cas)
    doc = _Doc(item, _empty_root(specs) if item is None else None)
    mkdir_all = bool(doc_flags & (MKDOC | ADD))
    results: list[tuple[int, bytes]] = []
    macros: dict[str, bool] = {}
    deleted = item is not None and item.deleted
    for index, spec in enumerate(specs):
        try:
            out = _apply(doc, spec, mkdir_all or bool(spec.flags & MKDIR_P), macros)
        except PathError as exc:
            raise SpecFailed(index, exc.status) from None
        if out == b"\0deleted":
            deleted = True
        elif out is not None:
            results.append((index, out))
    flags = item.flags if item is not None else 0
    value, datatype = _pack(doc, macros, new_cas, new_seqno, deleted)
    return Mutated(value, datatype, flags, deleted, results)


def _check_document(
    current: Item | None, specs: list[Spec], doc_flags: int, cas: int
) -> Item | None:
    if (doc_flags & MKDOC and doc_flags & ADD) or (doc_flags & ADD and cas):
        raise SubdocError(Status.Einval, "Mkdoc with Add, or Add with a CAS")
    item = _existing(current, doc_flags)
    if item is not None and item.deleted and not all(s.is_xattr for s in specs):
        item = None  # a body mutation on a tombstone is a (re)creation, or nothing
    live = item is not None and not item.deleted
    if doc_flags & ADD and live:
        raise SubdocError(Status.KeyEexists, "the document exists")
    if item is None and not doc_flags & (MKDOC | ADD):
        raise SubdocError(Status.KeyEnoent, "no such document")
    if cas:
        if item is None:
            raise SubdocError(Status.KeyEnoent, "no such document")
        if item.cas != cas:
            raise SubdocError(Status.KeyEexists, "CAS mismatch")
    return item


def _empty_root(specs: list[Spec]) -> Any:
    first = next((s for s in specs if not s.is_xattr), None)
    pushes = (Opcode.SubdocArrayPushLast, Opcode.SubdocArrayPushFirst, Opcode.SubdocArrayAddUnique)
    return [] if first is not None and first.opcode in pushes and not first.path else {}


def _apply(doc: _Doc, spec: Spec, mkdir: bool, macros: dict[str, bool]) -> bytes | None:
    if spec.opcode in (Opcode.Set, Opcode.Delete):
        return _full_document(doc, spec)
    if spec.is_xattr:
        path = _xattr_path(spec, write=True)
        raw = _macro_value(spec, macros) if spec.flags & EXPAND_MACROS else spec.value
        root: Any = doc.xattrs
        doc.xattrs_changed = True
    else:
        path, raw, root = subjson.parse_path(spec.path), spec.value, doc.root()
        doc.body_changed = True
    new_root, out = _mutate_one(spec.opcode, root, path, raw, mkdir)
    if not spec.is_xattr:
        doc.body = new_root
    return out


def _full_document(doc: _Doc, spec: Spec) -> bytes | None:
    if spec.path or spec.is_xattr:
        raise PathError(Status.SubdocPathEinval, "a full-document op takes no path")
    if spec.opcode == Opcode.Delete:
        doc.raw_body, doc.parsed, doc.body_changed = b"", True, False
        doc.body = None
        doc.xattrs = {k: v for k, v in doc.xattrs.items() if xattr.is_system(k)}
        doc.xattrs_changed = True
        return b"\0deleted"
    doc.raw_body, doc.body_changed = bytes(spec.value), False
    try:
        doc.body, doc.parsed, doc.json_body = json.loads(doc.raw_body), True, True
    except (ValueError, UnicodeDecodeError):
        doc.body, doc.parsed, doc.json_body = None, True, False
    return None


_Op = Callable[[Any, subjson.Path, bytes, bool], tuple[Any, bytes | None]]


def _mutate_one(
    opcode: int, root: Any, path: subjson.Path, raw: bytes, mkdir: bool
) -> tuple[Any, bytes | None]:
    return _OPS[opcode](root, path, raw, mkdir)


def _dict(add: bool) -> _Op:
    def op(root: Any, path: subjson.Path, raw: bytes, mkdir: bool) -> tuple[Any, bytes | None]:
        subjson.dict_set(root, path, subjson.parse_value(raw), mkdir=mkdir, add=add)
        return root, None

    return op


def _push(first: bool) -> _Op:
    def op(root: Any, path: subjson.Path, raw: bytes, mkdir: bool) -> tuple[Any, bytes | None]:
        subjson.array_push(root, path, subjson.parse_values(raw), mkdir=mkdir, first=first)
        return root, None

    return op


def _delete(root: Any, path: subjson.Path, raw: bytes, mkdir: bool) -> tuple[Any, bytes | None]:
    if raw:
        raise PathError(Status.SubdocValueCantinsert, "delete takes no value")
    subjson.delete(root, path)
    return root, None


def _replace(root: Any, path: subjson.Path, raw: bytes, mkdir: bool) -> tuple[Any, bytes | None]:
    return subjson.replace(root, path, subjson.parse_value(raw)), None


def _insert(root: Any, path: subjson.Path, raw: bytes, mkdir: bool) -> tuple[Any, bytes | None]:
    subjson.array_insert(root, path, subjson.parse_values(raw))
    return root, None


def _unique(root: Any, path: subjson.Path, raw: bytes, mkdir: bool) -> tuple[Any, bytes | None]:
    subjson.array_add_unique(root, path, subjson.parse_value(raw), mkdir=mkdir)
    return root, None


def _counter(root: Any, path: subjson.Path, raw: bytes, mkdir: bool) -> tuple[Any, bytes | None]:
    return root, b"%d" % subjson.counter(root, path, raw, mkdir=mkdir)


_OPS: dict[int, _Op] = {
    Opcode.SubdocDictAdd: _dict(add=True),
    Opcode.SubdocDictUpsert: _dict(add=False),
    Opcode.SubdocDelete: _delete,
    Opcode.SubdocReplace: _replace,
    Opcode.SubdocArrayPushLast: _push(first=False),
    Opcode.SubdocArrayPushFirst: _push(first=True),
    Opcode.SubdocArrayInsert: _insert,
    Opcode.SubdocArrayAddUnique: _unique,
    Opcode.SubdocCounter: _counter,
}


def _macro_value(spec: Spec, macros: dict[str, bool]) -> bytes:
    def swap(match: re.Match[bytes]) -> bytes:
        name = _MACROS.get(match.group(1))
        if name is None:
            raise PathError(Status.SubdocXattrUnknownMacro, f"unknown macro {match.group(0)!r}")
        macros[name] = True
        return json.dumps(_SENTINEL.format(name)).encode()

    return _MACRO.sub(swap, spec.value)


def _pack(
    doc: _Doc, macros: dict[str, bool], cas: int, seqno: int, deleted: bool
) -> tuple[bytes, int]:
    if doc.body_changed:
        doc.raw_body = subjson.dumps(doc.body) if doc.body is not None else b""
        doc.json_body = doc.body is not None
    if deleted:
        doc.raw_body = b""
        doc.xattrs = {
            k: v for k, v in doc.xattrs.items() if xattr.is_system(k) or doc.item is not None
        }
    pairs = {k: subjson.dumps(v) for k, v in doc.xattrs.items()}
    if macros:
        expansions = {
            "cas": cas_hex(cas),
            "seqno": f"0x{seqno:016x}",
            "crc": f"0x{crc32c.crc32c(doc.raw_body):08x}",
        }
        for name, text in expansions.items():
            placeholder = subjson.dumps(_SENTINEL.format(name))
            pairs = {k: v.replace(placeholder, subjson.dumps(text)) for k, v in pairs.items()}
    value, has_xattrs = xattr.join(pairs, doc.raw_body)
    datatype = (document.JSON if doc.json_body and doc.raw_body else 0) | (
        document.XATTR if has_xattrs else 0
    )
    return value, datatype
