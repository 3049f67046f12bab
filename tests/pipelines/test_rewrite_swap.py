"""When a compaction's rewrite, made from a snapshot, can be swapped into a later manifest
(``vtable.stale_rewrite``), and what a swap keeps (``vtable.swap``), without Spark."""

from __future__ import annotations

from pathlib import Path

from dcpkv.pipelines import vtable
from dcpkv.pipelines.vtable import Entry, Manifest, Rewrite


def _snapshot() -> Manifest:
    return Manifest(ord=5, files=["data/b1", "data/b2"], floors={0: 10, 1: 10}, compacted_ord=2)


def _later(*entries: Entry, files: tuple[str, ...] = ("data/b1", "data/b2", "data/b6")) -> Manifest:
    base = _snapshot()
    return Manifest(ord=6, files=list(files), floors=dict(base.floors), entries=list(entries))


def test_a_rewrite_is_stale_after_another_swap_or_an_exact_rollback_below_its_floor() -> None:
    done = Rewrite("data/c5", _snapshot(), {0: 20, 1: 10}, 3)
    assert not vtable.stale_rewrite(_later(), done)
    assert vtable.stale_rewrite(_later(files=("data/c4", "data/b6")), done)  # replaced already
    # exact rollback of vbucket 0 to 15: at or above the manifest's floor (10) when applied,
    # below the rewrite's (20): the versions it brings back may be gone
    assert vtable.stale_rewrite(_later(Entry("rollback", 0, 15, 6, 3)), done)
    assert not vtable.stale_rewrite(_later(Entry("rollback", 0, 20, 6, 3)), done)
    assert not vtable.stale_rewrite(_later(Entry("rollback", 1, 12, 6, 3)), done)
    # a resync (reset to -1 and skip) kills every rewritten row of the vbucket: no harm
    reset = [Entry("rollback", 0, -1, 6, 3), Entry("skip", 0, 40, 6, 3)]
    assert not vtable.stale_rewrite(_later(*reset), done)
    # entries the snapshot already had were applied by the rewrite itself
    assert not vtable.stale_rewrite(_later(Entry("rollback", 0, 15, 4, 3)), done)


def test_a_swap_keeps_what_came_after_the_snapshot(tmp_path: Path) -> None:
    for name in ("b1", "b2", "b6", "c5", "c0", "stray"):
        (tmp_path / "data" / name).mkdir(parents=True)
    base = _snapshot()
    base.extra["rows_since"] = 70
    current = _later(Entry("rollback", 1, -1, 6, 3), Entry("skip", 1, 4, 6, 3))
    current.retired = ["data/c0"]
    current.floors[1] = 4  # the resync's
    current.extra["rows_since"] = 100
    vtable.commit_manifest(tmp_path, current)
    swapped = vtable.swap(tmp_path, Rewrite("data/c5", base, {0: 20, 1: 12}, 33))
    assert swapped is not None
    assert swapped.files == ["data/c5", "data/b6"] and swapped.retired == ["data/b1", "data/b2"]
    assert swapped.entries == current.entries and swapped.ord == 6
    assert swapped.floors == {0: 20, 1: 4}  # vbucket 1 keeps its resync's floor
    assert swapped.compacted_ord == 5 and swapped.extra["rows_since"] == 30
    assert swapped.extra["compacted_rows"] == 33 and swapped.extra["dropped_through"] == 2
    assert vtable.load_manifest(tmp_path) == swapped
    left = {p.name for p in (tmp_path / "data").iterdir()}
    assert left == {"c5", "b6", "b1", "b2"}  # the old retired and the stray one are gone
