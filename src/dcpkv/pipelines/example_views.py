"""Example map functions for ``dcpkv view create`` over the sample data (``sample_data.py``).

Theory of operation
-------------------
A map function gets ``(key, doc)`` for every JSON document version and returns or yields
``(emit_key, emit_value)`` pairs; keys and values must be JSON values. Run with a reduce::

    dcpkv view create revenue --map dcpkv.pipelines.example_views:revenue_by_country --reduce sum
    dcpkv view create statuses --map dcpkv.pipelines.example_views:orders_by_status --reduce count
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def revenue_by_country(key: str, doc: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """Order totals by the country they ship to (reduce: sum or stats)."""
    if doc.get("type") == "order":
        yield doc["ship_to"]["country"], doc["total"]


def orders_by_status(key: str, doc: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """One row per order, keyed by status (reduce: count)."""
    if doc.get("type") == "order":
        yield doc["status"], 1


def orders_by_country_status(key: str, doc: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """Compound keys ``[country, status]`` -> total: range queries over one country."""
    if doc.get("type") == "order":
        yield [doc["ship_to"]["country"], doc["status"]], doc["total"]


def value_length(key: str, doc: dict[str, Any]) -> list[tuple[Any, Any]]:
    """Every document: its ``type`` (or null) -> its number of fields."""
    return [(doc.get("type"), len(doc))]
