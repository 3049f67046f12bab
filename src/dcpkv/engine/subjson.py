"""Sub-document paths and the JSON operations on them (sans-I/O).

Theory of operation
-------------------
A *path* names a place in a JSON document the way N1QL does (Couchbase's SubDocument.md):
components separated by dots, array positions in brackets right after what they index, a
component in backticks taken literally (two backticks are one), ``[-1]`` the last element,
the empty path the whole document::

    pDistributors[0].dName      ["pDistributors", 0, "dName"]
    `dot.ted`.sub               ["dot.ted", "sub"]
    a[1][-1]                    ["a", 1, -1]

:func:`parse_path` turns the text into components or raises :class:`PathError` with the
documented status: PathEinval for a malformed path, PathE2big for one over 1024 bytes or 32
levels. The operations work on the Python values ``json.loads`` gives (dicts keep key order)
and report every failure as a :class:`PathError`:

================ ===========================================================================
PathEnoent       a component does not exist (or an array position is past the end)
PathMismatch     a component treats a value as what it is not (a key into an array, a
                 position into an object, anything into a number), or the op needs an array
PathEexists      dict_add onto a key that exists, add_unique of a value already there
ValueCantinsert  the value is not JSON, or not what the op can insert (add_unique: not a
                 single primitive)
DeltaEinval      a counter delta that is zero, not an integer, or outside int64
NumErange        a counter whose result (or current value) is outside int64
ValueEtoodeep    a value that would nest the document deeper than 32 levels
================ ===========================================================================

``mkdir`` (the MkdirP path flag, implied by the Mkdoc and Add doc flags) creates missing
intermediate *objects*; never array elements, as documented.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status

MAX_PATH_BYTES = 1024
MAX_DEPTH = 32
INT64 = (-(1 << 63), (1 << 63) - 1)

Component = str | int
Path = list[Component]


class PathError(DcpkvError):
    """One path's failure; ``status`` is the sub-document status to answer."""

    status: Status

    def __init__(self, status: Status, message: str = "") -> None:
        super().__init__(message or status.name)
        self.status = status


def _einval(path: str, why: str) -> PathError:
    return PathError(Status.SubdocPathEinval, f"path {path!r}: {why}")


# -- paths -------------------------------------------------------------------------------------


def parse_path(path: str) -> Path:
    if len(path.encode()) > MAX_PATH_BYTES:
        raise PathError(Status.SubdocPathE2big, f"path over {MAX_PATH_BYTES} bytes")
    comps: Path = []
    i, n = 0, len(path)
    while i < n:
        if path[i] == "[":
            if not comps and i != 0:
                raise _einval(path, "misplaced '['")
            index, i = _index(path, i)
            comps.append(index)
        else:
            if comps or i:  # a key follows a '.' (or starts the path)
                if path[i] != "." or i + 1 >= n or path[i + 1] == "[":
                    raise _einval(path, f"unexpected {path[i]!r} at {i}")
                i += 1
            key, i = _key(path, i)
            comps.append(key)
    if len(comps) > MAX_DEPTH:
        raise PathError(Status.SubdocPathE2big, f"path deeper than {MAX_DEPTH} levels")
    return comps


def _index(path: str, i: int) -> tuple[int, int]:
    end = path.find("]", i)
    text = path[i + 1 : end] if end > 0 else ""
    if end < 0 or not (text.isdigit() or text == "-1") or not text.isascii():
        raise _einval(path, f"bad array index at {i}")
    return int(text), end + 1


def _key(path: str, i: int) -> tuple[str, int]:
    if path[i] == "`":
        return _quoted_key(path, i)
    start = i
    while i < len(path) and path[i] not in ".[]`":
        i += 1
    if i == start or (i < len(path) and path[i] in "]`"):
        raise _einval(path, f"empty or malformed component at {start}")
    return path[start:i], i


def _quoted_key(path: str, i: int) -> tuple[str, int]:
    out, i = [], i + 1
    while i < len(path):
        if path[i] == "`":
            if path[i + 1 : i + 2] == "`":
                out.append("`")
                i += 2
                continue
            return "".join(out), i + 1
        out.append(path[i])
        i += 1
    raise _einval(path, "unterminated backtick")


# -- values ------------------------------------------------------------------------------------


def parse_value(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise PathError(Status.SubdocValueCantinsert, "value is not JSON") from None


def parse_values(raw: bytes) -> list[Any]:
    """A comma-separated list of JSON values (array push/insert take several at once)."""
    values = parse_value(b"[" + raw + b"]") if raw.strip() else None
    if not isinstance(values, list) or not values:
        raise PathError(Status.SubdocValueCantinsert, "no value to insert")
    return values


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


# -- navigation --------------------------------------------------------------------------------


def _child(container: Any, comp: Component) -> Any:
    """The value at ``comp`` in ``container``; PathMismatch / PathEnoent."""
    if isinstance(comp, int):
        if not isinstance(container, list):
            raise PathError(Status.SubdocPathMismatch, "array index into a non-array")
        if not container or comp >= len(container):
            raise PathError(Status.SubdocPathEnoent, f"no element [{comp}]")
        return container[comp]
    if not isinstance(container, dict):
        raise PathError(Status.SubdocPathMismatch, f"key {comp!r} into a non-object")
    if comp not in container:
        raise PathError(Status.SubdocPathEnoent, f"no key {comp!r}")
    return container[comp]


def get(root: Any, path: Path) -> Any:
    node = root
    for comp in path:
        node = _child(node, comp)
    return node


def parent(root: Any, path: Path, *, mkdir: bool) -> Any:
    """The container holding ``path``'s last component (created as objects with ``mkdir``)."""
    node = root
    for comp, nxt in itertools.pairwise(path):
        try:
            node = _child(node, comp)
        except PathError as exc:
            if not (mkdir and exc.status == Status.SubdocPathEnoent and isinstance(comp, str)):
                raise
            if isinstance(nxt, int):  # an array would have to be made up: never
                raise
            node[comp] = {}
            node = node[comp]
    return node


def _check_depth(root: Any, path: Path, value: Any) -> None:
    if len(path) + depth(value) > MAX_DEPTH:
        raise PathError(Status.SubdocValueEtoodeep, "the document would nest too deep")


# -- lookups -----------------------------------------------------------------------------------


def count(root: Any, path: Path) -> int:
    node = get(root, path)
    if not isinstance(node, dict | list):
        raise PathError(Status.SubdocPathMismatch, "get_count of a non-container")
    return len(node)


# -- mutations (in place on ``root``; a root replace returns the new root) ------------------


def dict_set(root: Any, path: Path, value: Any, *, mkdir: bool, add: bool) -> None:
    if not path or isinstance(path[-1], int):
        raise PathError(Status.SubdocPathEinval, "dictionary ops need a key as last component")
    _check_depth(root, path, value)
    node = parent(root, path, mkdir=mkdir)
    if not isinstance(node, dict):
        raise PathError(Status.SubdocPathMismatch, "parent is not an object")
    if add and path[-1] in node:
        raise PathError(Status.SubdocPathEexists, f"key {path[-1]!r} exists")
    node[path[-1]] = value


def delete(root: Any, path: Path) -> None:
    if not path:
        raise PathError(Status.SubdocPathEinval, "cannot delete the whole document this way")
    node = parent(root, path, mkdir=False)
    _child(node, path[-1])  # exists, and of the right kind
    del node[path[-1]]


def replace(root: Any, path: Path, value: Any) -> Any:
    """The (possibly new) root."""
    if not path:
        return value
    _check_depth(root, path, value)
    node = parent(root, path, mkdir=False)
    _child(node, path[-1])
    node[path[-1]] = value
    return root


def _array_at(root: Any, path: Path, *, mkdir: bool) -> list[Any]:
    try:
        node = get(root, path)
    except PathError as exc:
        if not (mkdir and exc.status == Status.SubdocPathEnoent and path):
            raise
        holder = parent(root, path, mkdir=True)
        if not isinstance(holder, dict) or isinstance(path[-1], int):
            raise
        holder[path[-1]] = node = []
    if not isinstance(node, list):
        raise PathError(Status.SubdocPathMismatch, "not an array")
    return node


def array_push(root: Any, path: Path, values: list[Any], *, mkdir: bool, first: bool) -> None:
    for v in values:
        _check_depth(root, [*path, 0], v)
    node = _array_at(root, path, mkdir=mkdir)
    if first:
        node[:0] = values
    else:
        node.extend(values)


def array_insert(root: Any, path: Path, values: list[Any]) -> None:
    if not path or not isinstance(path[-1], int) or path[-1] < 0:
        raise PathError(Status.SubdocPathEinval, "array insert needs a position >= 0 last")
    node = parent(root, path, mkdir=False)
    if not isinstance(node, list):
        raise PathError(Status.SubdocPathMismatch, "not an array")
    if path[-1] > len(node):
        raise PathError(Status.SubdocPathEnoent, f"position {path[-1]} past the end")
    node[path[-1] : path[-1]] = values


def array_add_unique(root: Any, path: Path, value: Any, *, mkdir: bool) -> None:
    if isinstance(value, dict | list):
        raise PathError(Status.SubdocValueCantinsert, "add_unique takes one primitive value")
    node = _array_at(root, path, mkdir=mkdir)
    if any(isinstance(v, dict | list) for v in node):
        raise PathError(Status.SubdocPathMismatch, "the array holds non-primitives")
    if any(type(v) is type(value) and v == value for v in node):
        raise PathError(Status.SubdocPathEexists, "value already in the array")
    node.append(value)


def counter(root: Any, path: Path, delta_raw: bytes, *, mkdir: bool) -> int:
    """Adds the delta; the new number."""
    delta = _delta(delta_raw)
    if not path:
        raise PathError(Status.SubdocPathMismatch, "the document is not a number")
    node = parent(root, path, mkdir=mkdir)
    try:
        current = _child(node, path[-1])
    except PathError as exc:
        if exc.status != Status.SubdocPathEnoent or not isinstance(node, dict):
            raise
        current = 0
    if isinstance(current, bool) or not isinstance(current, int):
        raise PathError(Status.SubdocPathMismatch, "not an integer")
    result = current + delta
    if not INT64[0] <= current <= INT64[1] or not INT64[0] <= result <= INT64[1]:
        raise PathError(Status.SubdocNumErange, "the counter leaves int64")
    node[path[-1]] = result
    return result


def _delta(raw: bytes) -> int:
    text = raw.strip()
    if not text or not text.lstrip(b"-").isdigit():
        raise PathError(Status.SubdocDeltaEinval, "delta is not an integer")
    delta = int(text)
    if delta == 0 or not INT64[0] <= delta <= INT64[1]:
        raise PathError(Status.SubdocDeltaEinval, "delta is zero or outside int64")
    return delta
