"""``dcpkv.client``'s public names: all listed, all importable, each with a docstring a user can
read, and imported only when asked for (the package's importers, the commands and Spark's
Python processes, must not pay for the consumer)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import dcpkv.client as client

INIT = Path(client.__file__)
# A union of the event classes, not a class: its meaning is in the package docstring.
ALIASES = {"Event"}


def _type_checking_names() -> set[str]:
    """The names the package imports for type checkers (its ``if TYPE_CHECKING:`` block)."""
    tree = ast.parse(INIT.read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    return {
        alias.asname or alias.name
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_all_lists_every_name_once_and_the_three_lists_agree() -> None:
    assert len(client.__all__) == len(set(client.__all__))
    assert set(client.__all__) == _type_checking_names() == set(client._HOME_OF)
    assert client.__all__ == sorted(client.__all__)


@pytest.mark.parametrize("name", client.__all__)
def test_each_name_imports_from_its_home_and_has_a_docstring(name: str) -> None:
    obj = getattr(client, name)
    home = sys.modules[client._HOME_OF[name]]
    assert getattr(home, name) is obj
    if name in ALIASES:
        return
    assert obj.__module__ == home.__name__, "exported from where it is defined"
    doc = inspect.getdoc(obj) or ""
    # a dataclass without a docstring gets its signature as one: not something to read
    assert doc and not doc.startswith(f"{name}("), f"{name} has no docstring of its own"
    assert "see the module docstring" not in doc.splitlines()[0].lower()


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        client.Nope  # noqa: B018
    assert "SyncConsumer" in dir(client)


def _imported_by(statement: str) -> set[str]:
    """The modules a fresh interpreter loads for ``statement``."""
    code = (
        "import sys; before = set(sys.modules); "
        f"{statement}; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import dcpkv.client",
        "import dcpkv.client.settings",
        "import dcpkv.spark.source",  # what Spark's planner processes import
    ],
)
def test_the_package_imports_no_consumer_until_asked(statement: str) -> None:
    loaded = _imported_by(statement)
    assert "asyncio" not in loaded
    assert not {"dcpkv.client.consumer", "dcpkv.client.sync", "dcpkv.client.cluster"} & loaded


def test_a_public_name_imports_its_module_on_first_use() -> None:
    loaded = _imported_by("from dcpkv.client import SyncConsumer")
    assert "dcpkv.client.sync" in loaded
