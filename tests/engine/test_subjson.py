"""Sub-document paths and JSON operations, table-driven from SubDocument.md's examples and
its path statuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dcpkv.core.status import Status
from dcpkv.engine import subjson
from dcpkv.engine.subjson import PathError

S = Status
DOC = {
    "type": "product",
    "pDetails": {"audience": "children"},
    "pDistributors": [
        {"dName": "Going Out of Business Wholesale", "dAdded": ["Feb", 36, 2025]},
        {"dName": "Everything Must Go!", "dAdded": ["May", 72, 1492]},
    ],
    "dot.ted.field": None,
    "back`tick`field": None,
}


@pytest.mark.parametrize(
    ("path", "comps"),
    [
        ("", []),
        ("type", ["type"]),
        ("pDistributors[0].dName", ["pDistributors", 0, "dName"]),
        ("pDistributors[1].dAdded[2]", ["pDistributors", 1, "dAdded", 2]),
        ("`dot.ted.field`.subfield", ["dot.ted.field", "subfield"]),
        ("`back``tick``field`", ["back`tick`field"]),
        ("pDistributors[-1].dAdded[-1]", ["pDistributors", -1, "dAdded", -1]),
        ("[0]", [0]),
        ("a[1][2]", ["a", 1, 2]),
    ],
)  # fmt: skip
def test_paths_parse(path: str, comps: list[Any]) -> None:
    assert subjson.parse_path(path) == comps


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("a..b", S.SubdocPathEinval), (".a", S.SubdocPathEinval), ("a.", S.SubdocPathEinval),
        ("a[x]", S.SubdocPathEinval), ("a[-2]", S.SubdocPathEinval), ("a[1", S.SubdocPathEinval),
        ("a]", S.SubdocPathEinval), ("a[0]b", S.SubdocPathEinval), ("`open", S.SubdocPathEinval),
        ("a.[0]", S.SubdocPathEinval), ("x" * 1025, S.SubdocPathE2big),
        (".".join("a" * 33), S.SubdocPathE2big),
    ],
)  # fmt: skip
def test_bad_paths(path: str, status: Status) -> None:
    with pytest.raises(PathError) as err:
        subjson.parse_path(path)
    assert err.value.status == status


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("type", "product"),
        ("pDistributors[0].dName", "Going Out of Business Wholesale"),
        ("pDistributors[1].dAdded[2]", 1492),
        ("pDistributors[-1].dAdded[-1]", 1492),
        ("`dot.ted.field`", None),
        (S.SubdocPathMismatch, "pDistributors.count"),
        (S.SubdocPathMismatch, "type.category"),
        (S.SubdocPathEnoent, "pDetails.nope"),
        (S.SubdocPathEnoent, "pDistributors[5]"),
        (S.SubdocPathMismatch, "pDetails[0]"),
    ],
)  # fmt: skip
def test_get_per_the_spec_examples(path: Any, expected: Any) -> None:
    if isinstance(path, Status):  # (status, path): a failing lookup
        with pytest.raises(PathError) as err:
            subjson.get(DOC, subjson.parse_path(expected))
        assert err.value.status == path
    else:
        assert subjson.get(DOC, subjson.parse_path(path)) == expected


def mutate(doc: str, op: str, path: str, value: str = "", mkdir: bool = False) -> Any:
    root = json.loads(doc)
    p = subjson.parse_path(path)
    raw = value.encode()
    if op == "add":
        subjson.dict_set(root, p, subjson.parse_value(raw), mkdir=mkdir, add=True)
    elif op == "upsert":
        subjson.dict_set(root, p, subjson.parse_value(raw), mkdir=mkdir, add=False)
    elif op == "delete":
        subjson.delete(root, p)
    elif op == "replace":
        root = subjson.replace(root, p, subjson.parse_value(raw))
    elif op in ("push_last", "push_first"):
        values = subjson.parse_values(raw)
        subjson.array_push(root, p, values, mkdir=mkdir, first=op == "push_first")
    elif op == "insert":
        subjson.array_insert(root, p, subjson.parse_values(raw))
    elif op == "unique":
        subjson.array_add_unique(root, p, subjson.parse_value(raw), mkdir=mkdir)
    elif op == "counter":
        subjson.counter(root, p, raw, mkdir=mkdir)
    return root


@pytest.mark.parametrize(
    ("doc", "op", "path", "value", "mkdir", "expected"),
    [
        ('{"a":1}', "add", "b", "2", False, {"a": 1, "b": 2}),
        ('{"a":1}', "add", "a", "2", False, S.SubdocPathEexists),
        ('{"a":1}', "upsert", "a", "2", False, {"a": 2}),
        ('{"a":{}}', "upsert", "a.b.c", "1", False, S.SubdocPathEnoent),
        ('{"a":{}}', "upsert", "a.b.c", "1", True, {"a": {"b": {"c": 1}}}),
        ('{"a":[]}', "upsert", "a[0]", "1", False, S.SubdocPathEinval),
        ('{"a":1}', "upsert", "a.b", "1", False, S.SubdocPathMismatch),
        ('{"a":1}', "upsert", "b", "{nope", False, S.SubdocValueCantinsert),
        ('{"a":1,"b":2}', "delete", "a", "", False, {"b": 2}),
        ('{"a":[1,2,3]}', "delete", "a[-1]", "", False, {"a": [1, 2]}),
        ('{"a":1}', "delete", "b", "", False, S.SubdocPathEnoent),
        ('{"a":1}', "delete", "", "", False, S.SubdocPathEinval),
        ('{"a":1}', "replace", "a", '"x"', False, {"a": "x"}),
        ('{"a":1}', "replace", "b", "1", False, S.SubdocPathEnoent),
        ('{"a":1}', "replace", "", "[1]", False, [1]),
        ('{"a":[1]}', "push_last", "a", "2,3", False, {"a": [1, 2, 3]}),
        ('{"a":[1]}', "push_first", "a", "0", False, {"a": [0, 1]}),
        ('{"a":{}}', "push_last", "a", "1", False, S.SubdocPathMismatch),
        ("{}", "push_last", "a", "1", False, S.SubdocPathEnoent),
        ("{}", "push_last", "x.a", "1", True, {"x": {"a": [1]}}),
        ("[]", "push_last", "", "1", False, [1]),
        ('{"a":[1,3]}', "insert", "a[1]", "2", False, {"a": [1, 2, 3]}),
        ('{"a":[1]}', "insert", "a[1]", "2", False, {"a": [1, 2]}),
        ('{"a":[1]}', "insert", "a[3]", "2", False, S.SubdocPathEnoent),
        ('{"a":[1]}', "insert", "a", "2", False, S.SubdocPathEinval),
        ('{"a":[1]}', "insert", "a[-1]", "2", False, S.SubdocPathEinval),
        ('{"a":[1,"x"]}', "unique", "a", "2", False, {"a": [1, "x", 2]}),
        ('{"a":[1,"x"]}', "unique", "a", '"x"', False, S.SubdocPathEexists),
        ('{"a":[true]}', "unique", "a", "1", False, {"a": [True, 1]}),
        ('{"a":[[1]]}', "unique", "a", "1", False, S.SubdocPathMismatch),
        ('{"a":[1]}', "unique", "a", "[2]", False, S.SubdocValueCantinsert),
        ('{"n":5}', "counter", "n", "-7", False, {"n": -2}),
        ("{}", "counter", "n", "3", False, {"n": 3}),
        ('{"n":"x"}', "counter", "n", "1", False, S.SubdocPathMismatch),
        ('{"n":1}', "counter", "n", "0", False, S.SubdocDeltaEinval),
        ('{"n":1}', "counter", "n", "1.5", False, S.SubdocDeltaEinval),
        ('{"n":9223372036854775807}', "counter", "n", "1", False, S.SubdocNumErange),
        ('{"n":1}', "counter", "n", "9223372036854775808", False, S.SubdocDeltaEinval),
    ],
)  # fmt: skip
def test_mutations(doc: str, op: str, path: str, value: str, mkdir: bool, expected: Any) -> None:
    if isinstance(expected, Status):
        with pytest.raises(PathError) as err:
            mutate(doc, op, path, value, mkdir)
        assert err.value.status == expected
    else:
        assert mutate(doc, op, path, value, mkdir) == expected


def test_values_too_deep_are_refused() -> None:
    deep = "[" * 32 + "]" * 32
    with pytest.raises(PathError) as err:
        mutate('{"a":{}}', "upsert", "a.b", deep)
    assert err.value.status == S.SubdocValueEtoodeep
