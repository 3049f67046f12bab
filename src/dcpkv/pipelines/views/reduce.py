"""The reduce side of a view: built-in ``count``, ``sum``, ``stats`` or ``module:function``.

Theory of operation
-------------------
See the package docstring (:mod:`dcpkv.pipelines.views`) for how a view works as a whole.
"""

from collections.abc import Callable
from typing import Any

from dcpkv.pipelines.views.definition import ViewError, canonical, load_function


def reduce_rows(reduce: str, pairs: list[tuple[Any, Any]], group: bool) -> list[dict[str, Any]]:
    fn = _reducer(reduce)
    if not group:
        return [{"key": None, "value": fn([v for _k, v in pairs])}] if pairs else []
    out: list[dict[str, Any]] = []
    for k, v in pairs:  # sorted by key: equal keys are adjacent
        if out and canonical(out[-1]["key"]) == canonical(k):
            out[-1]["values"].append(v)
        else:
            out.append({"key": k, "values": [v]})
    return [{"key": row["key"], "value": fn(row["values"])} for row in out]


def _reducer(reduce: str) -> Callable[[list[Any]], Any]:
    if reduce == "count":
        return len
    if reduce == "sum":
        return _sum
    if reduce == "stats":
        return stats
    return load_function(reduce)


def _sum(values: list[Any]) -> Any:
    return sum(_numbers(values))


def _numbers(values: list[Any]) -> list[float | int]:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(nums) != len(values):
        raise ViewError("sum and stats reduce numbers only")
    return nums


def stats(values: list[Any]) -> dict[str, Any]:
    """Couchbase's _stats: sum, count, min, max, sumsqr."""
    nums = _numbers(values)
    return {
        "sum": sum(nums),
        "count": len(nums),
        "min": min(nums) if nums else None,
        "max": max(nums) if nums else None,
        "sumsqr": sum(n * n for n in nums),
    }
