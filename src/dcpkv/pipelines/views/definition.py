"""A view's definition (``view.json``: map, reduce, source) and its map, run in the tasks.

Theory of operation
-------------------
See the package docstring (:mod:`dcpkv.pipelines.views`) for how a view works as a whole.
"""

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dcpkv.core.errors import DcpkvError
from dcpkv.spark.rows import spark_fields

VIEW_FILE = "view.json"
BUILTIN_REDUCES = ("count", "sum", "stats")


class ViewError(DcpkvError, ValueError):
    """A view that does not exist, a bad definition, or a query it cannot answer."""


# -- definitions ----------------------------------------------------------------------------------


def load_function(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ViewError(f"{spec!r} is not module:function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ViewError(f"cannot load {spec!r}: {exc}") from None
    if not callable(fn):
        raise ViewError(f"{spec!r} is not callable")
    return fn


def create_view(views_dir: Path, name: str, map_fn: str, reduce: str | None = None) -> None:
    """Define view ``name``: ``map_fn`` and a custom ``reduce`` are ``module:function``."""
    load_function(map_fn)
    if reduce is not None and reduce not in BUILTIN_REDUCES:
        load_function(reduce)
    if not name or "/" in name or name.startswith((".", "_")):
        raise ViewError(f"bad view name {name!r}")
    folder = Path(views_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / VIEW_FILE).write_text(json.dumps({"map": map_fn, "reduce": reduce}, indent=1))


def view_definition(views_dir: Path, name: str) -> dict[str, Any]:
    path = Path(views_dir) / name / VIEW_FILE
    if not path.exists():
        raise ViewError(f"no view {name!r} in {views_dir}")
    return json.loads(path.read_text())


def save_definition(views_dir: Path, name: str, definition: dict[str, Any]) -> None:
    path = Path(views_dir) / name / VIEW_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(definition, indent=1))
    tmp.replace(path)


# -- the map, in the tasks -----------------------------------------------------------------------

_MAPS: dict[str, Callable[..., Any]] = {}


def canonical(value: Any) -> str:
    """JSON text that is equal for equal values (emit keys are compared as text)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def emissions(spec: str, key: bytes, value: bytes | None, op: str) -> list[tuple[str, str]] | None:
    """The map of one change: None for a rollback row, [] for deletions and non-JSON."""
    if op == "rollback":
        return None
    if op != "mutation" or value is None:
        return []
    try:
        doc = json.loads(bytes(value))
    except ValueError:
        return []  # not JSON: a view indexes JSON documents only, as in Couchbase
    if not isinstance(doc, dict):
        return []
    fn = _MAPS.get(spec) or _MAPS.setdefault(spec, load_function(spec))
    try:
        out = fn(bytes(key).decode("utf-8", "replace"), doc) or ()
        return [(canonical(k), canonical(v)) for k, v in out]
    except Exception:
        return []


SOURCE_COLUMNS = ("op", "vbucket", "key", "seqno", "vb_uuid")  # kept from the source's rows


def view_schema() -> Any:
    """The stored emission rows: the source's :data:`SOURCE_COLUMNS` as they are, the map's
    ``emits`` and the stream position ``ord``, ``pos``."""
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    emit = StructType([StructField("key", StringType()), StructField("value", StringType())])
    rest = [StructField("emits", ArrayType(emit))]
    rest += [StructField("ord", LongType()), StructField("pos", LongType())]
    return StructType(spark_fields(*SOURCE_COLUMNS) + rest)


def emission_table(spec: str, rows: Any) -> Any:
    """:func:`view_rows` (positions kept) of a pyarrow Table of mirror rows, on the driver: the
    same columns and values, for a small batch where a Spark job would cost far more than
    the map itself."""
    import pyarrow as pa

    emits = [
        emissions(spec, k, v, op)
        for k, v, op in zip(
            rows["key"].to_pylist(), rows["value"].to_pylist(), rows["op"].to_pylist(),
            strict=True,
        )
    ]  # fmt: skip
    emit = pa.struct([("key", pa.string()), ("value", pa.string())])
    as_dicts = [None if e is None else [{"key": k, "value": v} for k, v in e] for e in emits]
    return pa.table(
        {
            "op": rows["op"],
            "vbucket": rows["vbucket"],
            "key": rows["key"],
            "seqno": rows["seqno"],
            "vb_uuid": rows["vb_uuid"],
            "emits": pa.array(as_dicts, type=pa.list_(emit)),
            "ord": rows["ord"],
            "pos": rows["pos"],
        }
    )


def view_rows(spec: str, keep_position: bool = False) -> Callable[[Any], Any]:
    """Source (or mirror) rows -> stored emission rows."""
    from pyspark.sql import functions as F

    emits_type = view_schema()["emits"].dataType
    udf = F.udf(lambda k, v, op: emissions(spec, k, v, op), emits_type, useArrow=False)

    def transform(df: Any) -> Any:
        cols = [*SOURCE_COLUMNS, udf("key", "value", "op").alias("emits")]
        return df.select(*cols, *(["ord", "pos"] if keep_position else []))

    return transform
