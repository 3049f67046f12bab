"""Where a consumer is in each vbucket's history, and how to save that durably.

Theory of operation
-------------------
A resumable consumer must be able to say, after any crash or disconnect, exactly what it has
applied. For one vbucket that is a :class:`VbucketOffset`: the history branch it is on
(``vb_uuid``), the last seqno handed to the application (``seqno``), and the snapshot it is
inside (``snap_start``, ``snap_end``). The stream request on resume carries all four
(``001_f5025b6cebd15e6f.txt``): a consumer half way through snapshot {1, 4} at seqno 3 sends
``start=3, snapshot {1, 4}``, never ``{3, 3}``, because it does not hold a consistent view at
3 (deduplication may have folded an earlier change into a later seqno it has not seen yet).
Once the last item of a snapshot is delivered the consumer is consistent there and the
snapshot collapses to ``{end, end}``.

The rules a :class:`VbucketProgress` follows, all driven by what the application was given:

* A snapshot marker is only *pending*. The saved snapshot moves when the first item of the new
  snapshot is delivered (or a SeqnoAdvanced inside it): a consumer that saw a marker and then
  lost the connection holds nothing of that snapshot and resumes exactly where it was.
  The next marker, though, proves the previous snapshot was sent in full, so it completes
  that one even when its last seqnos never reached us (a purged tombstone at the end of a
  disk snapshot, a filtered item).
* Delivering seqno ``n`` sets ``seqno = n``; ``n == snap_end`` collapses the snapshot and
  records ``n`` as a *consistent point*.
* The consistent points (ascending, 0 implicit) are the only places the consumer can safely
  roll back to. A producer's rollback seqno R may fall inside a snapshot the consumer received
  (case 4b's ``upper`` is a branch point, 4c's ``snap_start`` need not be an item the consumer
  ever saw), and stopping there would keep a partial, deduplicated view and later miss the
  changes folded into the seqnos above R. So a rollback to R lands on the newest consistent
  point ``p <= R``: the request ``start=p, {p, p}`` is then always accepted on that branch,
  since ``p <= R <= upper``. The list is bounded; when it is full every other point of the
  older half is dropped, so it keeps recent points dense and old ones sparse rather than
  forgetting the past outright (a deep rollback then costs more re-streaming, never
  correctness).
* ``seen`` is the highest seqno of anything the application holds. It only exceeds the offset
  after a mutation-log repair re-fetched documents newer than the rollback point; the
  failover-log comparison then uses it as spec 002's "highest seqno seen".
* The failover log is the producer's, adopted on every accepted stream request (which also
  sets ``vb_uuid`` to its newest entry). A rollback prunes it to the entries at or below the
  rollback point, and the offset then names the newest remaining branch, or 0 when none.

:class:`Offsets` holds one progress per vbucket and saves them as JSON with a fixed key order
and integers for every 64-bit value (so 2**64-1 survives exactly), written to a temporary file,
fsynced and renamed over the old one: a crash leaves either the old or the new file, never
half of one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcpkv.core.errors import DcpkvError
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.fastinit import fast_builder, fast_init
from dcpkv.core.files import atomic_write
from dcpkv.core.seqno import U64_MAX

FORMAT_VERSION = 1
DEFAULT_MAX_CONSISTENT_POINTS = 64


class OffsetError(DcpkvError, ValueError):
    """An impossible offset move: the producer broke the stream's rules, or a bug."""


class OffsetsFileError(DcpkvError, ValueError):
    """An offsets file that cannot be read."""


def _u64(value: Any, what: str, error: type[ValueError] = OffsetError) -> int:
    # bool is an int subclass and a float may have lost precision: neither is a seqno.
    if not isinstance(value, int) or isinstance(value, bool):
        raise error(f"{what} must be an integer, got {value!r}")
    if not 0 <= value <= U64_MAX:
        raise error(f"{what} {value} is outside the unsigned 64-bit range")
    return value


@fast_init
@dataclass(frozen=True, slots=True)
class VbucketOffset:
    """Where a consumer stands in one vbucket: the history branch (``vb_uuid``), the last
    seqno handed over (``seqno``) and the snapshot it is inside (``snap_start``,
    ``snap_end``); :attr:`complete` when ``seqno`` ends its snapshot. A stream resumed from it
    starts right after ``seqno`` (the module docstring gives the rules)."""

    vb_uuid: int = 0
    seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0

    def __post_init__(self) -> None:
        for name in ("vb_uuid", "seqno", "snap_start", "snap_end"):
            _u64(getattr(self, name), name)
        if not self.snap_start <= self.seqno <= self.snap_end:
            raise OffsetError(
                f"offset seqno {self.seqno} outside its snapshot "
                f"{{{self.snap_start}, {self.snap_end}}}"
            )

    @classmethod
    def at(cls, seqno: int, vb_uuid: int) -> VbucketOffset:
        """A consistent offset: the whole history up to ``seqno`` on branch ``vb_uuid``."""
        return cls(vb_uuid, seqno, seqno, seqno)

    @property
    def complete(self) -> bool:
        """True when the consumer holds a consistent view at ``seqno``."""
        return self.seqno == self.snap_end

    def stream_request_fields(self) -> tuple[int, int, int, int]:
        """``(start, vb_uuid, snap_start, snap_end)`` for the stream request that resumes."""
        return self.seqno, self.vb_uuid, self.snap_start, self.snap_end


# A VbucketOffset from fields the caller already checked (u64s, the seqno inside its
# snapshot): the delivery path builds one per change, and the checks would double its cost.
_offset = fast_builder(VbucketOffset)


def uuid_at(failover_log: Sequence[FailoverEntry], seqno: int) -> int:
    """The branch a consistent point lies on: the newest entry at or below it, else 0."""
    for entry in failover_log:  # newest first
        if entry.seqno <= seqno:
            return entry.uuid
    return 0


class VbucketProgress:
    """The mutable progress of one vbucket: offset, pending marker, consistent points, log."""

    __slots__ = (
        "_consistent",
        "_delivered_in_snapshot",
        "_max_points",
        "_seen",
        "failover_log",
        "offset",
        "pending",
    )

    def __init__(
        self,
        offset: VbucketOffset | None = None,
        *,
        failover_log: Iterable[FailoverEntry] = (),
        consistent: Iterable[int] = (),
        max_points: int = DEFAULT_MAX_CONSISTENT_POINTS,
    ) -> None:
        if max_points < 2:
            raise ValueError("keep at least two consistent points")
        self.offset = offset or VbucketOffset()
        self.failover_log: tuple[FailoverEntry, ...] = tuple(failover_log)
        self.pending: tuple[int, int] | None = None
        # Whether an item of the current, partial snapshot was delivered on this connection
        # (after a resume mid-snapshot the producer starts a new snapshot: clear).
        self._delivered_in_snapshot = False
        self._seen = 0
        self._max_points = max_points
        self._consistent: list[int] = sorted({p for p in consistent if p > 0})
        if self.offset.complete and self.offset.seqno > 0:
            self._note_consistent(self.offset.seqno)

    # -- reading ------------------------------------------------------------------------

    @property
    def consistent_points(self) -> tuple[int, ...]:
        """Ascending; 0 is always implicitly one too."""
        return tuple(self._consistent)

    @property
    def snapshot_seqno(self) -> int:
        """The last complete snapshot (the client sentinel of spec 002's algorithm)."""
        return self._consistent[-1] if self._consistent else 0

    @property
    def seen_seqno(self) -> int:
        """The highest seqno of anything the application holds: the offset, or more after a
        mutation-log repair re-fetched documents newer than the rollback point."""
        return max(self.offset.seqno, self._seen)

    def note_seen(self, seqno: int) -> None:
        """The application now holds data up to ``seqno`` (re-fetched after a rollback)."""
        self._seen = max(self._seen, _u64(seqno, "seen seqno"))

    def consistent_at_or_below(self, seqno: int) -> int:
        best = 0
        for point in self._consistent:
            if point > seqno:
                break
            best = point
        return best

    def copy(self) -> VbucketProgress:
        """An independent copy (the facade hands one over with every event: ``sync.py``)."""
        new = VbucketProgress.__new__(VbucketProgress)
        new.offset, new.failover_log, new.pending = self.offset, self.failover_log, self.pending
        new._delivered_in_snapshot, new._seen = self._delivered_in_snapshot, self._seen
        new._max_points, new._consistent = self._max_points, self._consistent.copy()
        return new

    # -- moves driven by the stream -----------------------------------------------------

    def marker(self, start: int, end: int) -> VbucketOffset:
        """A snapshot marker arrived; it only matters once an item of it is delivered."""
        _u64(start, "snapshot start")
        _u64(end, "snapshot end")
        if start > end:
            raise OffsetError(f"snapshot marker {{{start}, {end}}} ends before it starts")
        self._close_previous_snapshot()
        if end <= self.offset.seqno:
            raise OffsetError(
                f"snapshot marker {{{start}, {end}}} is not past seqno {self.offset.seqno}"
            )
        self.pending = (start, end)
        return self.offset

    def deliver(self, seqno: int) -> VbucketOffset:
        """An item (or SeqnoAdvanced) at ``seqno`` was handed to the application."""
        if type(seqno) is not int or not 0 <= seqno <= U64_MAX:
            _u64(seqno, "seqno")
        o = self.offset
        if seqno <= o.seqno:
            raise OffsetError(f"seqno {seqno} does not advance past {o.seqno}")
        if self.pending is not None:
            start, end = self.pending
        elif o.seqno != o.snap_end:
            start, end = o.snap_start, o.snap_end
        else:
            raise OffsetError(f"seqno {seqno} arrived outside any snapshot")
        if not start <= seqno <= end:
            raise OffsetError(f"seqno {seqno} outside its snapshot {{{start}, {end}}}")
        self.pending = None
        if seqno == end:
            self._complete_at(end)
        else:
            self.offset = _offset(o.vb_uuid, seqno, start, end)
            self._delivered_in_snapshot = True
        return self.offset

    def followed(self, offset: VbucketOffset) -> None:
        """Repeat here a :meth:`deliver` made on a copy of this progress, given the offset it
        returned (the facade's caller-side offsets: ``sync.py``). Exact only when this
        progress was equal to the copy before that delivery."""
        self.pending = None
        self.offset = offset
        if offset.seqno == offset.snap_end:
            self._delivered_in_snapshot = False
            self._note_consistent(offset.seqno)
        else:
            self._delivered_in_snapshot = True

    def accepted(self, failover_log: Sequence[FailoverEntry]) -> VbucketOffset:
        """The producer accepted our stream request: adopt its failover log and branch."""
        if not failover_log:
            raise OffsetError("an accepted stream request must carry a failover log")
        self.failover_log = tuple(failover_log)
        self.pending = None
        self._delivered_in_snapshot = False
        o = self.offset
        self.offset = VbucketOffset(failover_log[0].uuid, o.seqno, o.snap_start, o.snap_end)
        return self.offset

    def roll_back(self, seqno: int) -> VbucketOffset:
        """Roll back to (at most) ``seqno``: to the newest consistent point at or below it."""
        _u64(seqno, "rollback seqno")
        point = self.consistent_at_or_below(min(seqno, self.offset.seqno))
        self.failover_log = tuple(e for e in self.failover_log if e.seqno <= point)
        self._consistent = [p for p in self._consistent if p <= point]
        self.pending = None
        self._delivered_in_snapshot = False
        self._seen = point
        self.offset = VbucketOffset.at(point, uuid_at(self.failover_log, point))
        return self.offset

    def discard_pending(self) -> None:
        """The connection dropped: a marker with nothing delivered yet is forgotten."""
        self.pending = None
        self._delivered_in_snapshot = False

    # -- internals ----------------------------------------------------------------------

    def _close_previous_snapshot(self) -> None:
        # A new marker proves the previous snapshot was sent in full, even when its last
        # seqnos never reached us (a purged tombstone at a disk snapshot's end, a filtered
        # item): the consumer is consistent at that snapshot's end.
        if self.pending is not None:
            self._complete_at(self.pending[1])
        elif self._delivered_in_snapshot and not self.offset.complete:
            self._complete_at(self.offset.snap_end)

    def _complete_at(self, seqno: int) -> None:
        self.offset = _offset(self.offset.vb_uuid, seqno, seqno, seqno)
        self._delivered_in_snapshot = False
        self._note_consistent(seqno)

    def _note_consistent(self, seqno: int) -> None:
        if self._consistent and self._consistent[-1] >= seqno:
            return
        self._consistent.append(seqno)
        if len(self._consistent) > self._max_points:
            half = len(self._consistent) // 2
            self._consistent = self._consistent[:half:2] + self._consistent[half:]

    # -- JSON -----------------------------------------------------------------------------

    def to_json_obj(self) -> dict[str, Any]:
        o = self.offset
        return {
            "vb_uuid": o.vb_uuid,
            "seqno": o.seqno,
            "snap_start": o.snap_start,
            "snap_end": o.snap_end,
            "seen": self._seen,
            "consistent": list(self._consistent),
            "failover_log": [e.to_json_obj() for e in self.failover_log],
        }

    @classmethod
    def from_json_obj(
        cls, doc: Any, what: str, *, max_points: int = DEFAULT_MAX_CONSISTENT_POINTS
    ) -> VbucketProgress:
        err = OffsetsFileError
        if not isinstance(doc, dict):
            raise err(f"{what} must be an object")
        missing = [k for k in _PROGRESS_KEYS if k not in doc]
        if missing:
            raise err(f"{what} lacks {', '.join(missing)}")
        fields = [_u64(doc[k], f"{what} {k}", err) for k in _PROGRESS_KEYS[:4]]
        seen = _u64(doc["seen"], f"{what} seen", err)
        points = doc["consistent"]
        if not isinstance(points, list):
            raise err(f"{what} consistent must be an array")
        consistent = [_u64(p, f"{what} consistent point", err) for p in points]
        log = doc["failover_log"]
        if not isinstance(log, list):
            raise err(f"{what} failover_log must be an array")
        entries = []
        for i, item in enumerate(log):
            if not isinstance(item, dict) or set(item) != {"id", "seq"}:
                raise err(f"{what} failover_log entry {i} must be {{id, seq}}")
            entries.append(
                FailoverEntry(
                    _u64(item["id"], f"{what} failover_log entry {i} id", err),
                    _u64(item["seq"], f"{what} failover_log entry {i} seq", err),
                )
            )
        try:
            offset = VbucketOffset(*fields)
        except OffsetError as exc:
            raise err(f"{what}: {exc}") from None
        progress = cls(offset, failover_log=entries, max_points=max_points)
        progress._consistent = sorted({p for p in consistent if 0 < p <= offset.seqno})
        progress._seen = seen
        if offset.complete and offset.seqno > 0:
            progress._note_consistent(offset.seqno)
        return progress


_PROGRESS_KEYS = (
    "vb_uuid",
    "seqno",
    "snap_start",
    "snap_end",
    "seen",
    "consistent",
    "failover_log",
)


class Offsets:
    """A consumer's progress in every vbucket (one :class:`VbucketProgress` each, created on
    first use; ``offsets[vb]`` is its :class:`VbucketOffset`). :meth:`save` writes them to a
    JSON file atomically, :meth:`load_or_new` reads them back: give them to a consumer
    (``offsets=``, or ``stream(start=offsets)``) and it resumes where they stand."""

    __slots__ = ("_max_points", "_vbuckets")

    def __init__(self, *, max_points: int = DEFAULT_MAX_CONSISTENT_POINTS) -> None:
        self._max_points = max_points
        self._vbuckets: dict[int, VbucketProgress] = {}

    def progress(self, vbucket: int) -> VbucketProgress:
        try:  # one look-up when it exists (the facade asks once per event)
            return self._vbuckets[vbucket]
        except KeyError:
            new = self._vbuckets[vbucket] = VbucketProgress(max_points=self._max_points)
            return new

    def set_progress(self, vbucket: int, progress: VbucketProgress) -> None:
        """Replace one vbucket's progress (a stream that starts "now", not from 0)."""
        self._vbuckets[vbucket] = progress

    def copy(self) -> Offsets:
        """An independent copy: every vbucket's progress copied."""
        new = Offsets(max_points=self._max_points)
        new._vbuckets = {vb: p.copy() for vb, p in self._vbuckets.items()}
        return new

    def __getitem__(self, vbucket: int) -> VbucketOffset:
        return self.progress(vbucket).offset

    def __contains__(self, vbucket: object) -> bool:
        return vbucket in self._vbuckets

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._vbuckets))

    def __len__(self) -> int:
        return len(self._vbuckets)

    # -- JSON -----------------------------------------------------------------------------

    def to_json(self) -> str:
        doc = {
            "version": FORMAT_VERSION,
            "vbuckets": {str(vb): self._vbuckets[vb].to_json_obj() for vb in self},
        }
        # No sort_keys: the order above is the fixed one (and "10" would sort before "2").
        return json.dumps(doc, indent=1) + "\n"

    @classmethod
    def from_json(
        cls, text: str | bytes, *, max_points: int = DEFAULT_MAX_CONSISTENT_POINTS
    ) -> Offsets:
        err = OffsetsFileError
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise err(f"offsets are not valid JSON: {exc}") from None
        if not isinstance(doc, dict) or "vbuckets" not in doc or "version" not in doc:
            raise err("offsets must be an object with version and vbuckets")
        if doc["version"] != FORMAT_VERSION:
            raise err(f"offsets format version {doc['version']!r} is not {FORMAT_VERSION}")
        if not isinstance(doc["vbuckets"], dict):
            raise err("offsets vbuckets must be an object")
        offsets = cls(max_points=max_points)
        for key, value in doc["vbuckets"].items():
            if not key.isdigit() or int(key) > 0xFFFF:
                raise err(f"vbucket id {key!r} is not a number from 0 to 65535")
            offsets._vbuckets[int(key)] = VbucketProgress.from_json_obj(
                value, f"vbucket {key}", max_points=max_points
            )
        return offsets

    # -- files ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Replace ``path`` atomically: write a temporary file, fsync it, rename it over."""
        path = Path(path)
        atomic_write(path, self.to_json().encode(), temp_path(path))

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, max_points: int = DEFAULT_MAX_CONSISTENT_POINTS
    ) -> Offsets:
        """Read a saved file; a missing file is an error (use :meth:`load_or_new`)."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise OffsetsFileError(f"cannot read offsets file {path}: {exc}") from None
        try:
            return cls.from_json(data, max_points=max_points)
        except OffsetsFileError as exc:
            raise OffsetsFileError(f"corrupt offsets file {path}: {exc}") from None

    @classmethod
    def load_or_new(
        cls, path: str | os.PathLike[str], *, max_points: int = DEFAULT_MAX_CONSISTENT_POINTS
    ) -> Offsets:
        """A fresh :class:`Offsets` when ``path`` does not exist yet, else :meth:`load`."""
        if not Path(path).exists():
            return cls(max_points=max_points)
        return cls.load(path, max_points=max_points)


def temp_path(path: Path) -> Path:
    """The one temporary name a save writes first (a stale one is simply overwritten)."""
    return path.with_name(path.name + ".tmp")
