"""The lock file (``tools/lock.py``): when it counts as stale, and what the committed one pins."""

from __future__ import annotations

import copy
import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _load_lock_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock_tool", ROOT / "tools" / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock = _load_lock_module()
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _edited(path: tuple[str, ...], change: Any) -> dict[str, Any]:
    """A copy of pyproject.toml with the list or value at ``path`` replaced by ``change(it)``."""
    out = copy.deepcopy(PYPROJECT)
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = change(node.get(path[-1]))
    return out


# (what changed, the path in pyproject.toml, the change, stale?)
CASES = [
    ("a runtime range", ("project", "dependencies"), lambda d: [*d[:-1], "crc32c>=9"], True),
    ("a new runtime dependency", ("project", "dependencies"), lambda d: [*d, "zstd"], True),
    ("a dev range", ("project", "optional-dependencies"),
     lambda x: {**x, "dev": [*x["dev"], "pytest-xdist"]}, True),
    ("a new extra", ("project", "optional-dependencies"), lambda x: {**x, "s3": ["boto3"]}, True),
    ("the build backend", ("build-system", "requires"), lambda _: ["hatchling>=1.30"], True),
    ("requires-python", ("project", "requires-python"), lambda _: ">=3.12", True),
    ("the runtime list's order", ("project", "dependencies"), lambda d: d[::-1], False),
    ("ruff's settings", ("tool", "ruff", "line-length"), lambda _: 120, False),
    ("the description", ("project", "description"), lambda _: "something else", False),
]  # fmt: skip


@pytest.mark.parametrize(("what", "path", "change", "stale"), CASES, ids=[c[0] for c in CASES])
def test_a_lock_goes_stale_only_when_a_declaration_changes(
    what: str, path: tuple[str, ...], change: Any, stale: bool
) -> None:
    fresh = lock.header(lock.declarations_digest(PYPROJECT))
    assert lock.stale_reason(PYPROJECT, fresh) is None
    reason = lock.stale_reason(_edited(path, change), fresh)
    assert (reason is not None) == stale, what


def test_a_lock_without_a_digest_or_no_lock_at_all_is_stale() -> None:
    assert lock.stale_reason(PYPROJECT, "ruff==0.6 \\\n    --hash=sha256:00\n") is not None
    assert lock.stale_reason(PYPROJECT, None) is not None


def _pins(text: str) -> dict[str, str]:
    """name -> the requirement line of every package of a pip-compile lock."""
    return {
        canonicalize_name(Requirement(line.split(" \\")[0].split(";")[0]).name): line
        for line in text.splitlines()
        if line and not line[0].isspace() and not line.startswith("#")
    }


def test_the_committed_lock_is_fresh_pinned_and_hashed() -> None:
    text = (ROOT / "requirements.lock").read_text()
    assert lock.stale_reason(PYPROJECT, text) is None, "run make lock"
    pins = _pins(text)
    declared = lock.declarations(PYPROJECT)
    wanted = [
        *declared["dependencies"],
        *declared["optional-dependencies"][lock.EXTRA],
        *declared["build-system"],
        *declared["venv-tools"],
    ]
    missing = {canonicalize_name(Requirement(r).name) for r in wanted} - pins.keys()
    assert not missing, f"declared but not in requirements.lock: {sorted(missing)}"
    # every package exactly pinned, each followed by its files' hashes
    for block in re.split(r"\n(?=\S)", text):
        if block.startswith("#"):
            continue
        assert re.match(r"^[A-Za-z0-9._-]+==[^ ]+", block), block.splitlines()[0]
        assert "--hash=sha256:" in block, block.splitlines()[0]
