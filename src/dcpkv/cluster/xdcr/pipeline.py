"""XDCR's pipeline decisions: which changes go, in what batches, checked how, sent as what.

Theory of operation
-------------------
A replicator turns the source's DCP changes (the client's ``Mutation``, ``Deletion`` and
``Expiration`` events) into with-meta writes on the target. Every decision on the way is
here, as plain functions and objects; the shell (``replicator.py``) only moves bytes.

1. **Filter** (:class:`ChangeFilter`): a key regular expression (``re.search`` on the key
   decoded as UTF-8, undecodable bytes replaced), and optionally no deletions and/or no
   expirations. A change filtered out counts as ``docs_filtered`` and is never sent.
2. **Batches** (:class:`Batcher`): changes gather until 500 items or 2 MB of keys and values
   (the reference's sizes), or until the source has nothing more to send right now. Inside
   a batch only a key's newest change is kept (deduplicated: the older one would lose
   conflict resolution against it anyway).
3. **Optimistic threshold** (:func:`needs_get_meta`): a change whose value is larger than
   256 bytes is first checked with GetMeta on the target, and dropped
   (``docs_failed_cr_source``) when conflict resolution would refuse it
   (:func:`would_win`); smaller ones are sent at once and the target refuses losers itself
   (``docs_failed_cr_target``). Deletions carry no value, so they are always sent.
4. **Requests** (:func:`write_request`): SetWithMeta for a mutation, DelWithMeta for a
   deletion or an expiration (options IS_EXPIRATION), keeping the source's CAS, rev seqno,
   flags, expiry and datatype; FORCE_ACCEPT when the target bucket resolves by timestamp.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dcpkv.client.events import Deletion, Expiration, Mutation
from dcpkv.core.conflict_resolution import ConflictMode, Meta, incoming_wins
from dcpkv.protocol import kv
from dcpkv.protocol.constants import Datatype
from dcpkv.protocol.fast_with_meta import with_meta_frame
from dcpkv.protocol.kv import WithMetaOption

Change = Mutation | Deletion | Expiration

BATCH_ITEMS = 500
BATCH_BYTES = 2 * 1024 * 1024
OPTIMISTIC_THRESHOLD = 256  # bytes of value; larger documents are checked with GetMeta first


@dataclass(frozen=True, slots=True)
class ChangeFilter:
    """What a replication sends: keys matching ``key_regex`` (None: all), and deletions and
    expirations unless told to skip them."""

    key_regex: str | None = None
    skip_deletions: bool = False
    skip_expirations: bool = False
    _pattern: re.Pattern[str] | None = field(default=None, init=False, compare=False)
    # no expression, nothing skipped: every change passes (the replicator asks no more)
    everything: bool = field(default=False, init=False, compare=False)

    def __post_init__(self) -> None:
        everything = not (self.key_regex or self.skip_deletions or self.skip_expirations)
        object.__setattr__(self, "everything", everything)
        if self.key_regex:
            try:
                object.__setattr__(self, "_pattern", re.compile(self.key_regex))
            except re.error as exc:
                raise ValueError(f"filter expression {self.key_regex!r}: {exc}") from None

    def passes(self, change: Change) -> bool:
        if isinstance(change, Expiration):
            if self.skip_expirations:
                return False
        elif isinstance(change, Deletion) and self.skip_deletions:
            return False
        if self._pattern is None:
            return True
        return self._pattern.search(change.key.decode("utf-8", "replace")) is not None


def change_bytes(change: Change) -> int:
    return len(change.key) + (len(change.value) if isinstance(change, Mutation) else 0)


class Batcher:
    """Gathers changes into batches of at most ``max_items`` changes or ``max_bytes`` bytes;
    a key's newer change replaces its older one in the same batch."""

    def __init__(self, max_items: int = BATCH_ITEMS, max_bytes: int = BATCH_BYTES) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self._changes: dict[tuple[int, bytes], Change] = {}
        self._bytes = 0
        self.deduplicated = 0

    def add(self, change: Change) -> list[Change] | None:
        """Take ``change``; the batch to send when it is now full (else None)."""
        slot = (change.vbucket, change.key)
        older = self._changes.pop(slot, None)
        if older is not None:
            self._bytes -= change_bytes(older)
            self.deduplicated += 1
        self._changes[slot] = change
        # (change_bytes inlined: once per replicated change)
        self._bytes += len(change.key) + (len(change.value) if type(change) is Mutation else 0)
        if len(self._changes) >= self.max_items or self._bytes >= self.max_bytes:
            return self.take()
        return None

    def take(self) -> list[Change]:
        """The changes gathered so far (possibly none), oldest first; the batch starts anew."""
        batch = list(self._changes.values())
        self._changes.clear()
        self._bytes = 0
        return batch

    def __len__(self) -> int:
        return len(self._changes)


def needs_get_meta(change: Change, threshold: int = OPTIMISTIC_THRESHOLD) -> bool:
    """Whether to ask the target's metadata before sending (step 3 of the module docstring)."""
    return isinstance(change, Mutation) and len(change.value) > threshold


def change_meta(change: Change) -> Meta:
    if isinstance(change, Mutation):
        return Meta(
            cas=change.cas, rev_seqno=change.rev_seqno, expiry=change.expiration,
            flags=change.flags, xattrs=bool(change.datatype & Datatype.Xattr),
        )  # fmt: skip
    return Meta(cas=change.cas, rev_seqno=change.rev_seqno, deleted=True)


def target_meta(answer: kv.GetMetaResponse) -> Meta:
    return Meta(
        cas=answer.cas, rev_seqno=answer.rev_seqno, expiry=answer.expiry, flags=answer.flags,
        deleted=answer.deleted,
        xattrs=bool((answer.item_datatype or 0) & Datatype.Xattr),
    )  # fmt: skip


def would_win(mode: ConflictMode, change: Change, target: kv.GetMetaResponse | None) -> bool:
    """What the target would decide (``target`` None: the key is absent there)."""
    local = None if target is None else target_meta(target)
    return incoming_wins(mode, change_meta(change), local)


def write_options(target_mode: ConflictMode) -> int | None:
    """The options word of every write to a target bucket of ``target_mode`` (None: none)."""
    return int(WithMetaOption.FORCE_ACCEPT) if target_mode is ConflictMode.LWW else None


_SETQ, _DELQ = int(kv.SetqWithMeta.OPCODE), int(kv.DelqWithMeta.OPCODE)
_EXPIRY, _JSON = int(WithMetaOption.IS_EXPIRATION), int(Datatype.JSON)


def write_frame(change: Change, options: int | None, opaque: int) -> bytes:
    """:func:`write_request`'s quiet form (SetqWithMeta, DelqWithMeta: answered only when
    refused), encoded with ``opaque``, to the change's own vbucket; ``options`` from
    :func:`write_options`. The replicator's hot path, equal to the message's encoding (a
    differential test)."""
    if isinstance(change, Mutation):
        return with_meta_frame(
            _SETQ, change.vbucket, change.key, change.value, change.datatype & _JSON,
            change.flags, change.expiration, change.rev_seqno, change.cas, options, opaque,
        )  # fmt: skip
    if isinstance(change, Expiration):
        options = (options or 0) | _EXPIRY
    return with_meta_frame(
        _DELQ, change.vbucket, change.key, b"", 0, 0, change.delete_time, change.rev_seqno,
        change.cas, options, opaque,
    )  # fmt: skip


def write_request(change: Change, target_mode: ConflictMode, vbucket: int) -> kv.SetWithMeta:
    """The with-meta write carrying ``change`` with its source metadata, to the target's
    ``vbucket`` of its key (the clusters may have different vbucket counts). The consumer
    hands over values inflated and without xattrs: only the JSON bit is kept."""
    options = int(WithMetaOption.FORCE_ACCEPT) if target_mode is ConflictMode.LWW else 0
    if isinstance(change, Mutation):
        return kv.SetWithMeta(
            vbucket=vbucket, key=change.key, value=change.value, flags=change.flags,
            expiration=change.expiration, rev_seqno=change.rev_seqno, meta_cas=change.cas,
            datatype=change.datatype & Datatype.JSON, options=options or None,
        )  # fmt: skip
    if isinstance(change, Expiration):
        options |= WithMetaOption.IS_EXPIRATION
    return kv.DelWithMeta(
        vbucket=vbucket, key=change.key, expiration=change.delete_time,
        rev_seqno=change.rev_seqno, meta_cas=change.cas, options=options or None,
    )  # fmt: skip
