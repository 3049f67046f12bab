"""The streaming source's offset: where every vbucket's stream stands, as Spark checkpoints it.

Theory of operation
-------------------
Spark stores a source offset as JSON in its checkpoint (the offset log is written before a
micro-batch runs, the commit log after) and hands it back as ``start`` of the next batch or on
restart. For one vbucket the offset is the client library's :class:`VbucketOffset` (branch
``vb_uuid``, ``seqno``, snapshot ``{snap_start, snap_end}``) plus ``points``: a few earlier
batch ends on the same history (see below).

Every 64-bit number is a *decimal string*: JSON numbers pass through the JVM on their way to
the checkpoint and back, and a u64 such as a vbucket uuid of 2**64-1 does not survive a trip
through a double or a signed long. Strings do. Keys are in a fixed order and vbuckets are
listed in ascending numeric order, so that the same position always serialises to the same
text (Spark compares offsets to decide whether there is anything new).

``points`` make a rollback cheap. A batch ends at a seqno the producer closed a snapshot at
(it clamps a snapshot marker to the stream's end seqno), so downstream holds a consistent view
there: a point the consumer may roll back to. The client library only rolls back to such
points (a rollback seqno inside a snapshot the consumer saw part of would lose deduplicated
changes: spec 001), and without earlier ones it would have to go to 0 and re-stream the whole
vbucket. The list is bounded: past :data:`MAX_POINTS`, every other entry of the older half is
dropped, so recent points stay dense and old ones sparse. A point is only kept while the
history below it is unchanged (see ``plan.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dcpkv.client.offsets import Offsets, VbucketOffset
from dcpkv.core.errors import DcpkvError
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.seqno import U64_MAX

FORMAT = 1
MAX_POINTS = 8
_FIELDS = ("vb_uuid", "seqno", "snap_start", "snap_end")


class SparkOffsetError(DcpkvError, ValueError):
    """A source offset (from a checkpoint or an option) that cannot be used."""


@dataclass(frozen=True, slots=True)
class VbPosition:
    """One vbucket's position: the client offset and earlier consistent points below it."""

    offset: VbucketOffset
    points: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if list(self.points) != sorted(set(self.points)) or any(
            not 0 < p <= self.offset.seqno for p in self.points
        ):
            raise SparkOffsetError(f"points {self.points} must ascend within 1..seqno")

    @classmethod
    def at(cls, seqno: int, vb_uuid: int, points: Sequence[int] = ()) -> VbPosition:
        return cls(VbucketOffset.at(seqno, vb_uuid), tuple(points))

    def advanced_to(self, seqno: int, vb_uuid: int, *, valid_to: int) -> VbPosition:
        """The position after a batch that read up to ``seqno`` on branch ``vb_uuid``.

        ``valid_to`` is the highest seqno whose history did not change since this position
        (the position's own seqno, or the rollback point when the branch moved): only
        consistent points at or below it stay usable.
        """
        o = self.offset
        points = [p for p in self.points if p <= valid_to]
        if o.complete and 0 < o.seqno <= valid_to:
            points.append(o.seqno)
        return VbPosition.at(seqno, vb_uuid, _bounded(sorted({p for p in points if p < seqno})))


def _bounded(points: list[int]) -> list[int]:
    if len(points) <= MAX_POINTS:
        return points
    half = len(points) // 2
    return points[:half:2] + points[half:]


class SparkOffsets(Mapping[int, VbPosition]):
    """vbucket -> :class:`VbPosition`, immutable, with Spark's dict form both ways."""

    __slots__ = ("_vbs",)

    def __init__(self, positions: Mapping[int, VbPosition]) -> None:
        self._vbs = {vb: positions[vb] for vb in sorted(positions)}

    def __getitem__(self, vb: int) -> VbPosition:
        return self._vbs[vb]

    def __iter__(self) -> Iterator[int]:
        return iter(self._vbs)

    def __len__(self) -> int:
        return len(self._vbs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SparkOffsets) and self._vbs == other._vbs

    def __hash__(self) -> int:
        return hash(tuple(self._vbs.items()))

    def __repr__(self) -> str:
        return f"SparkOffsets({self._vbs!r})"

    @classmethod
    def earliest(cls, vbuckets: Sequence[int]) -> SparkOffsets:
        return cls({vb: VbPosition(VbucketOffset()) for vb in vbuckets})

    # -- Spark's form --------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "vbuckets": {
                str(vb): {
                    **{f: str(getattr(pos.offset, f)) for f in _FIELDS},
                    "points": [str(p) for p in pos.points],
                }
                for vb, pos in self._vbs.items()
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, doc: Any) -> SparkOffsets:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise SparkOffsetError(f"a dcpkv offset is an object with format {FORMAT}")
        vbs = doc.get("vbuckets")
        if not isinstance(vbs, dict):
            raise SparkOffsetError("a dcpkv offset needs a vbuckets object")
        return cls({_vb_id(key): _position(value, key) for key, value in vbs.items()})

    @classmethod
    def from_dict_json(cls, text: str) -> SparkOffsets:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SparkOffsetError(f"not valid JSON: {exc}") from None
        return cls.from_dict(doc)

    # -- to the client library ------------------------------------------------------------

    def client_offsets(
        self, vbuckets: Sequence[int], failover_logs: Mapping[int, Sequence[FailoverEntry]]
    ) -> Offsets:
        """The client's :class:`Offsets` for a stream starting here.

        The consumer's failover log is the part of the producer's log that the consumer's
        branch descends from (its entry and the older ones): that is what the consumer knows
        of its history, and it lets the library's failover-log check find a rollback before
        asking. A branch the producer does not know gets a one-entry log: the producer then
        answers with a rollback to 0, the only safe point.
        """
        vbs: dict[str, Any] = {}
        for vb in vbuckets:
            pos = self._vbs[vb]
            o = pos.offset
            log = _ancestry(failover_logs.get(vb, ()), o.vb_uuid)
            vbs[str(vb)] = {
                **{f: getattr(o, f) for f in _FIELDS},
                "seen": o.seqno,
                "consistent": list(pos.points),
                "failover_log": [e.to_json_obj() for e in log],
            }
        return Offsets.from_json(json.dumps({"version": 1, "vbuckets": vbs}))


def _ancestry(producer_log: Sequence[FailoverEntry], uuid: int) -> list[FailoverEntry]:
    if uuid == 0:
        return []
    for i, entry in enumerate(producer_log):
        if entry.uuid == uuid:
            return list(producer_log[i:])
    return [FailoverEntry(uuid, 0)]


def _vb_id(key: Any) -> int:
    if not isinstance(key, str) or not key.isdigit() or int(key) > 0xFFFF:
        raise SparkOffsetError(f"vbucket id {key!r} is not a number from 0 to 65535")
    return int(key)


def _u64(value: Any, what: str) -> int:
    # Accept JSON integers too (hand-written startingOffsets), but never floats or bools.
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U64_MAX:
        raise SparkOffsetError(f"{what} must be an unsigned 64-bit integer, got {value!r}")
    return value


def _position(doc: Any, vb: str) -> VbPosition:
    if not isinstance(doc, dict):
        raise SparkOffsetError(f"vbucket {vb}: expected an object")
    missing = [f for f in _FIELDS if f not in doc]
    if missing:
        raise SparkOffsetError(f"vbucket {vb}: missing {', '.join(missing)}")
    fields = [_u64(doc[f], f"vbucket {vb} {f}") for f in _FIELDS]
    points = doc.get("points", [])
    if not isinstance(points, list):
        raise SparkOffsetError(f"vbucket {vb}: points must be a list")
    try:
        return VbPosition(
            VbucketOffset(*fields), tuple(_u64(p, f"vbucket {vb} point") for p in points)
        )
    except ValueError as exc:
        raise SparkOffsetError(f"vbucket {vb}: {exc}") from None
