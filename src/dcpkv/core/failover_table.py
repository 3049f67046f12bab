"""The failover table (failover log) of one vbucket.

Theory of operation
-------------------
Each entry is a *partition version*: a random 64-bit uuid naming a history branch, and the
seqno at which that branch began. Entries are kept newest first. A new branch is cut whenever a
node cannot be sure it saw everything the previous owner of the vbucket did: on becoming
active, and on warm-up after an unclean shutdown. Cutting a branch at seqno S first forgets
every entry that began above S (that history no longer exists here), then pushes the new
entry in front and trims the table to its capacity (oldest entries go first).

The table travels in two forms: JSON, ``[{"id": UUID, "seq": SEQNO}, ...]`` (storage and the
``humpty-dumpty`` tool), and the wire form of a stream-request OK or GetFailoverLog answer,
16 bytes per entry (uuid u64, seqno u64, big-endian), newest first. A table loaded from either
form is *sanitised* before use (see :meth:`FailoverTable.sanitised`).

The table is a plain value: no I/O, no clock. Randomness comes from an injectable
``random.Random`` so tests are reproducible.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dcpkv.core.errors import DcpkvError
from dcpkv.core.seqno import U64_MAX

DEFAULT_CAPACITY = 25
_ENTRY = struct.Struct(">QQ")


class FailoverTableError(DcpkvError, ValueError):
    """A failover table in JSON or wire form that cannot be read."""


@dataclass(frozen=True, slots=True)
class FailoverEntry:
    """One partition version: history branch ``uuid`` began at ``seqno``."""

    uuid: int
    seqno: int

    def to_json_obj(self) -> dict[str, int]:
        return {"id": self.uuid, "seq": self.seqno}


def _check_u64(value: Any, what: str) -> int:
    # bool is an int subclass; a JSON `true` is not a seqno.
    if not isinstance(value, int) or isinstance(value, bool):
        raise FailoverTableError(f"{what} must be an integer, got {value!r}")
    if not 0 <= value <= U64_MAX:
        raise FailoverTableError(f"{what} {value} is outside the unsigned 64-bit range")
    return value


class FailoverTable:
    """The failover log of one vbucket, newest entry first."""

    __slots__ = ("_capacity", "_entries", "_json", "_rng")

    def __init__(
        self,
        entries: Iterable[FailoverEntry] = (),
        *,
        capacity: int = DEFAULT_CAPACITY,
        rng: random.Random | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("a failover table holds at least one entry")
        self._capacity = capacity
        self._entries: list[FailoverEntry] = list(entries)[:capacity]
        self._rng = rng or random.SystemRandom()
        self._json: str | None = None  # to_json's text, until the entries change

    # -- construction -------------------------------------------------------------------

    @classmethod
    def fresh(
        cls,
        high_seqno: int = 0,
        *,
        capacity: int = DEFAULT_CAPACITY,
        rng: random.Random | None = None,
    ) -> FailoverTable:
        """A table holding one new branch that begins at ``high_seqno``."""
        table = cls(capacity=capacity, rng=rng)
        table.create_entry(high_seqno)
        return table

    @classmethod
    def sanitised(
        cls,
        entries: Iterable[FailoverEntry],
        high_seqno: int,
        *,
        capacity: int = DEFAULT_CAPACITY,
        rng: random.Random | None = None,
    ) -> FailoverTable:
        """Keep, newest to oldest, entries with a non-zero uuid whose seqno does not exceed the
        previous kept entry's; an empty result gets a fresh entry at ``high_seqno``."""
        kept: list[FailoverEntry] = []
        for entry in entries:
            if entry.uuid == 0:
                continue
            if kept and entry.seqno > kept[-1].seqno:
                continue
            kept.append(entry)
        if not kept:
            return cls.fresh(high_seqno, capacity=capacity, rng=rng)
        return cls(kept, capacity=capacity, rng=rng)

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        high_seqno: int,
        *,
        capacity: int = DEFAULT_CAPACITY,
        rng: random.Random | None = None,
    ) -> FailoverTable:
        """Parse ``[{"id":..,"seq":..}, ...]`` and sanitise it."""
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FailoverTableError(f"failover table is not valid JSON: {exc}") from None
        return cls.sanitised(entries_from_json_obj(doc), high_seqno, capacity=capacity, rng=rng)

    @classmethod
    def from_wire(
        cls,
        body: bytes | memoryview,
        *,
        capacity: int = DEFAULT_CAPACITY,
        rng: random.Random | None = None,
    ) -> FailoverTable:
        """Decode a stream-request OK / GetFailoverLog body (16 bytes per entry)."""
        return cls(decode_wire(body), capacity=max(capacity, len(body) // 16), rng=rng)

    # -- reading ------------------------------------------------------------------------

    @property
    def entries(self) -> tuple[FailoverEntry, ...]:
        return tuple(self._entries)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def latest(self) -> FailoverEntry:
        if not self._entries:
            raise FailoverTableError("the failover table is empty")
        return self._entries[0]

    @property
    def latest_uuid(self) -> int:
        """The uuid a consumer sends in a stream request: 0 when it knows no history."""
        return self._entries[0].uuid if self._entries else 0

    def uuid_holding(self, seqno: int) -> int:
        """The uuid to ask for a stream from ``seqno`` with: the newest branch that wrote at or
        below ``seqno``. A branch that begins at ``seqno`` or above has written nothing a
        consumer holding ``seqno`` has, so the history up to ``seqno`` is its parent's: a
        replica cut a branch at warm-up after an unclean shutdown (it was active) and then made
        a replica again by a delta recovery holds its old active's history exactly, and asking
        with the new, empty branch's uuid (which no other node knows) rolled it back to 0.
        The latest uuid when no older branch is there (or nothing is held yet)."""
        if seqno > 0:
            for entry in self._entries:
                if entry.seqno < seqno:
                    return entry.uuid
        return self.latest_uuid

    def index_of(self, uuid: int) -> int | None:
        for i, entry in enumerate(self._entries):
            if entry.uuid == uuid:
                return i
        return None

    def __iter__(self) -> Iterator[FailoverEntry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FailoverTable):
            return NotImplemented
        return self._entries == other._entries

    def __repr__(self) -> str:
        return f"FailoverTable({self._entries!r})"

    # -- changing -----------------------------------------------------------------------

    def create_entry(self, seqno: int) -> FailoverEntry:
        """Cut a new history branch at ``seqno`` and return its entry."""
        _check_u64(seqno, "seqno")
        self._entries = [e for e in self._entries if e.seqno <= seqno]
        taken = {e.uuid for e in self._entries}
        uuid = 0
        while uuid == 0 or uuid in taken:
            uuid = self._rng.getrandbits(64)
        entry = FailoverEntry(uuid, seqno)
        self._entries.insert(0, entry)
        del self._entries[self._capacity :]
        self._json = None
        return entry

    def prune(self, rollback_seqno: int) -> None:
        """Forget the branches that began above ``rollback_seqno`` (after a rollback).

        A consumer that rolls back to zero past every branch it knew is left with an empty
        table, and so asks with uuid 0 next time.
        """
        self._entries = [e for e in self._entries if e.seqno <= rollback_seqno]
        self._json = None

    def replace(self, other: FailoverTable | Sequence[FailoverEntry]) -> None:
        """Adopt the producer's table (a consumer does so on every OK and rollback)."""
        self._entries = list(other)[: max(self._capacity, len(other))]
        self._json = None

    # -- serialising --------------------------------------------------------------------

    def to_json_obj(self) -> list[dict[str, int]]:
        return [e.to_json_obj() for e in self._entries]

    def to_json(self) -> str:
        # The flusher writes every dirty vbucket's table on every flush, and it rarely
        # changes: the text is kept until a change (every method that changes the entries
        # drops it), so a flush pays an attribute read per vbucket, not a comparison.
        if self._json is None:
            self._json = json.dumps(self.to_json_obj(), separators=(",", ":"))
        return self._json

    def to_wire(self) -> bytes:
        return encode_wire(self._entries)


def entries_from_json_obj(doc: Any) -> list[FailoverEntry]:
    """Entries from an already-parsed JSON value, with a clear error for the wrong shape."""
    if not isinstance(doc, list):
        raise FailoverTableError("failover table must be a JSON array of {id, seq} objects")
    entries = []
    for i, item in enumerate(doc):
        if not isinstance(item, dict) or "id" not in item or "seq" not in item:
            raise FailoverTableError(f"failover table entry {i} must be an object with id and seq")
        entries.append(
            FailoverEntry(
                _check_u64(item["id"], f"entry {i} id"), _check_u64(item["seq"], f"entry {i} seq")
            )
        )
    return entries


def encode_wire(entries: Iterable[FailoverEntry]) -> bytes:
    return b"".join(_ENTRY.pack(e.uuid, e.seqno) for e in entries)


def decode_wire(body: bytes | memoryview) -> list[FailoverEntry]:
    """Entries from a wire body; empty or ragged bodies are an error (a log is never empty)."""
    if len(body) == 0:
        raise FailoverTableError("failover log body is empty")
    if len(body) % _ENTRY.size:
        raise FailoverTableError(
            f"failover log body of {len(body)} bytes is not a whole number of 16-byte entries"
        )
    return [FailoverEntry(u, s) for u, s in _ENTRY.iter_unpack(body)]
