"""When a table is compacted: every ``every`` batches at the earliest, then once it grew by
half of what the last compaction kept, and at the latest after COMPACT_LATEST * every."""

from __future__ import annotations

import pytest

from dcpkv.pipelines.vtable import COMPACT_LATEST, Manifest, compaction_due, note_rows


def table(batches: int, grown: int, kept: int | None) -> Manifest:
    m = Manifest(ord=100 + batches, compacted_ord=100)
    if kept is not None:
        m.extra["compacted_rows"] = kept
    note_rows(m, grown)
    return m


@pytest.mark.parametrize(
    ("batches", "grown", "kept", "every", "due", "why"),
    [
        (10, 5, None, 10, True, "never compacted with a count (an older table): as before"),
        (9, 10_000, 100, 10, False, "too few batches, however much it grew"),
        (10, 50, 100, 10, True, "grew by half"),
        (10, 49, 100, 10, False, "grew by less than half"),
        (10 * COMPACT_LATEST, 1, 100, 10, True, "at the latest"),
        (10, 50, 100, None, False, "compaction switched off"),
    ],
)
def test_compaction_due(
    batches: int, grown: int, kept: int | None, every: int | None, due: bool, why: str
) -> None:
    assert compaction_due(table(batches, grown, kept), every) is due, why


def test_rows_add_up_across_batches() -> None:
    m = table(10, 20, 100)
    assert not compaction_due(m, 10)
    note_rows(m, 30)
    assert compaction_due(m, 10)
