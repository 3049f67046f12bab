"""Every exception class dcpkv defines derives from DcpkvError, and no two share a name (a
caller catches one base; a traceback's class name says which of them it was)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import defaultdict

import dcpkv
from dcpkv.core.errors import DcpkvError


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(dcpkv.__path__, "dcpkv."):
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.startswith("dcpkv."):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


EXCEPTIONS = _exception_classes()


def test_the_walk_finds_the_package_exceptions() -> None:
    names = {e.__name__ for e in EXCEPTIONS}
    assert {"DcpkvError", "ConfigError", "ClusterConfigError", "StreamStateError"} <= names


def test_every_exception_derives_from_dcpkv_error() -> None:
    outside = sorted(
        f"{e.__module__}.{e.__qualname__}" for e in EXCEPTIONS if not issubclass(e, DcpkvError)
    )
    assert outside == []


def test_no_two_exceptions_share_a_name() -> None:
    homes: dict[str, list[str]] = defaultdict(list)
    for e in EXCEPTIONS:
        homes[e.__name__].append(e.__module__)
    assert {name: mods for name, mods in homes.items() if len(mods) > 1} == {}
