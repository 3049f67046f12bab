"""The generated sample data: deterministic, valid JSON, referentially sound."""

from __future__ import annotations

import itertools
import json

from dcpkv.pipelines.sample_data import Sizes, changes, documents


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    assert list(documents(300, seed=1)) == list(documents(300, seed=1))
    assert list(documents(300, seed=1)) != list(documents(300, seed=2))


def test_counts_keys_and_references() -> None:
    docs = {key: json.loads(value) for key, value in documents(1000)}
    sizes = Sizes.for_total(1000)
    assert len(docs) == sizes.total == 1000
    kinds = {
        kind: sum(1 for d in docs.values() if d["type"] == kind)
        for kind in ("customer", "product", "order")
    }
    assert kinds == {"customer": sizes.customers, "product": sizes.products, "order": sizes.orders}
    for doc in docs.values():
        if doc["type"] == "order":
            assert f"customer::{doc['customer']:06d}".encode() in docs
            assert all(f"product::{line['product']:06d}".encode() in docs for line in doc["lines"])
            assert doc["total"] == round(
                sum(line["qty"] * line["price"] for line in doc["lines"]), 2
            )


def test_changes_update_create_and_delete() -> None:
    first = dict(documents(100))
    stream = list(itertools.islice(changes(100), 500))
    deletions = [key for key, doc in stream if doc is None]
    created = {key for key, doc in stream if doc is not None and key not in first}
    assert deletions and created
    assert all(key.startswith(b"order::") for key in deletions + list(created))
    assert all(json.loads(doc)["type"] for _, doc in stream if doc is not None)
