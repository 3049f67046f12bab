"""The main job's last word: do the mirror and the view equal the bucket?

Theory of operation
-------------------
Run once the writers stopped and both pipelines caught up (``AvailableNow``), so the bucket
holds still while it is read. The truth is the bucket's live documents, read by Spark in the
source's ``documents`` mode through the same connection as the pipelines (on a cluster:
each vbucket from its active, through the map). Then:

* **mirror**: the mirror's current documents (:func:`~dcpkv.pipelines.mirror.read_mirror`)
  must be exactly the truth, key for key and byte for byte;
* **view**: the view's current emissions (:func:`~dcpkv.pipelines.views.query.
  current_emissions`) must be exactly what the view's map function emits over the truth
  (compared as multisets of (document, emit key, emit value)): a reduce of equal emissions
  is equal, so the grouped answers agree too.

A difference is counted per document (missing, extra, or another value), never hidden; the
job prints the result and exits 1 when it failed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcpkv.pipelines.mirror import read_mirror
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.views import definition
from dcpkv.pipelines.views.query import current_emissions


@dataclass(frozen=True)
class EndCheck:
    documents: int  # in the bucket
    mirror_diff: int  # documents missing from the mirror, extra, or with another value
    view_rows: int  # emissions the bucket's documents give
    view_diff: int  # emissions missing from the view, or extra

    @property
    def ok(self) -> bool:
        return self.mirror_diff == 0 and self.view_diff == 0

    def line(self) -> str:
        mirror = "equals" if self.mirror_diff == 0 else f"differs in {self.mirror_diff:,} docs"
        view = "equals" if self.view_diff == 0 else f"differs in {self.view_diff:,} rows"
        verdict = "passed" if self.ok else "FAILED"
        return (
            f"End check {verdict}: the mirror {mirror} the bucket ({self.documents:,} documents);"
            f" the view {view} the map of the bucket ({self.view_rows:,} rows)."
        )


def bucket_documents(spark: Any, source: SourceSettings) -> dict[bytes, bytes]:
    frame = spark.read.format("dcpkv").options(**source.options()).option("mode", "documents")
    return {bytes(r.key): bytes(r.value) for r in frame.load().select("key", "value").collect()}


def differing(a: dict[bytes, bytes], b: dict[bytes, bytes]) -> int:
    return sum(1 for key in a.keys() | b.keys() if a.get(key) != b.get(key))


def end_check(
    spark: Any, source: SourceSettings, mirror: Path, views: Path, view: str, view_map: str
) -> EndCheck:
    truth = bucket_documents(spark, source)
    mirrored = {bytes(r.key): bytes(r.value) for r in read_mirror(spark, mirror).collect()}
    expected: Counter[tuple[str, str, str]] = Counter()
    for key, value in truth.items():
        doc = key.decode("utf-8", "replace")
        emitted = definition.emissions(view_map, key, value, "mutation") or []
        expected.update((doc, k, v) for k, v in emitted)
    actual = Counter(current_emissions(views / view))
    return EndCheck(
        documents=len(truth),
        mirror_diff=differing(truth, mirrored),
        view_rows=sum(expected.values()),
        view_diff=sum(((expected - actual) + (actual - expected)).values()),
    )
