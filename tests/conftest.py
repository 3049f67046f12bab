"""Suite-wide collection rules."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist (make test runs two workers), the tests on the one session-scoped
    # SparkSession run on one worker: one JVM, started once.
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
