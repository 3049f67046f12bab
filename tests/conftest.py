"""Suite-wide collection rules."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test marked long (minutes) runs only when a -m expression names it: make test stays
    # within its budget, make chaos-test runs them.
    if "long" not in (config.option.markexpr or ""):
        skip = pytest.mark.skip(reason="long: run with pytest -m long (make chaos-test)")
        for item in items:
            if item.get_closest_marker("long") is not None:
                item.add_marker(skip)
