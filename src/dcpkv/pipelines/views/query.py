"""Querying a view: its current emissions, in CouchDB collation, optionally reduced.

Theory of operation
-------------------
See the package docstring (:mod:`dcpkv.pipelines.views`) for how a view works as a whole.
"""

import json
import time
from pathlib import Path
from typing import Any

from dcpkv.pipelines import vtable
from dcpkv.pipelines.source_node import SourceSettings, server_seqnos
from dcpkv.pipelines.table_job import caught_up
from dcpkv.pipelines.views.definition import ViewError, canonical, view_definition
from dcpkv.pipelines.views.reduce import reduce_rows

POLL_SECONDS = 0.2


# -- querying -----------------------------------------------------------------------------------


def query_view(
    spark: Any | None,
    views_dir: Path,
    name: str,
    *,
    key: Any = None,
    range: tuple[Any, Any] | None = None,
    group: bool = False,
    stale: str = "ok",  # "ok" or "false", checked below (the CLI passes the user's text)
    source: SourceSettings | None = None,
    timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """Rows ``{"id", "key", "value"}`` sorted by emit key (no reduce), or reduced rows
    ``{"key", "value"}`` (one with key None, or one per emit key with ``group``).

    ``range`` is inclusive at both ends; ``stale="false"`` waits for the view to catch up
    with the server as it is now (``source`` or the one the view last ran from).
    """
    definition = view_definition(views_dir, name)
    table = Path(views_dir) / name
    if stale == "false":
        wait_caught_up(table, source or _recorded_source(definition), timeout)
    elif stale != "ok":
        raise ViewError(f"stale must be ok or false, not {stale!r}")
    rows = current_emissions(table)
    if key is not None:
        wanted = canonical(key)
        rows = [r for r in rows if r[1] == wanted]
    decoded = [(doc, json.loads(k), json.loads(v)) for doc, k, v in rows]
    if range is not None:
        low, high = collation_key(range[0]), collation_key(range[1])
        decoded = [r for r in decoded if low <= collation_key(r[1]) <= high]
    decoded.sort(key=lambda r: (collation_key(r[1]), r[0]))
    reduce = definition.get("reduce")
    if reduce is None:
        return [{"id": doc, "key": k, "value": v} for doc, k, v in decoded]
    return reduce_rows(reduce, [(k, v) for _doc, k, v in decoded], group)


def _recorded_source(definition: dict[str, Any]) -> SourceSettings:
    src = definition.get("source", {})
    if "server" in src:
        return SourceSettings.from_json_obj(src["server"])
    raise ViewError("stale=false needs the server: pass source (the view follows a mirror)")


def wait_caught_up(table: Path, source: SourceSettings, timeout: float) -> None:
    """Block until the view has applied the server's high seqnos of now (same branch)."""
    highs = server_seqnos(source)
    deadline = time.monotonic() + timeout
    while not caught_up(vtable.load_manifest(table).applied_seqnos(), highs):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"view {table.name} did not catch up within {timeout}s")
        time.sleep(POLL_SECONDS)


def current_emissions(table: Path) -> list[tuple[str, str, str]]:
    """(document key, emit key JSON, emit value JSON) of every current document version."""
    import pyarrow.compute as pc

    current = vtable.current_arrow(table, vtable.load_manifest(table), ["emits"])
    if current is None:
        return []
    docs = current.filter(pc.equal(current["op"], "mutation"))
    out: list[tuple[str, str, str]] = []
    for doc_key, emits in zip(docs["key"].to_pylist(), docs["emits"].to_pylist(), strict=True):
        doc = doc_key.decode("utf-8", "replace")
        out.extend((doc, e["key"], e["value"]) for e in emits or ())
    return out


def collation_key(value: Any) -> tuple[Any, ...]:
    """CouchDB's order of JSON values: null < false < true < numbers < strings < arrays <
    objects; arrays element by element, objects by their (key, value) pairs."""
    if value is None:
        return (0,)
    if value is False:
        return (1,)
    if value is True:
        return (2,)
    if isinstance(value, int | float):
        return (3, value)
    if isinstance(value, str):
        return (4, value)
    if isinstance(value, list):
        return (5, tuple(collation_key(v) for v in value))
    return (6, tuple((k, collation_key(v)) for k, v in sorted(value.items())))
