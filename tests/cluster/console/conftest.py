"""The web console's browser: Debian's chromium (``make test`` installs it when it can), driven
by Playwright with the system's executable, never a downloaded browser. The tests that need it
skip with the reason when there is none. Screenshots go to ``build/artefacts/console/``
(ignored by git; kept after the run for a person to look at)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ARTEFACTS = Path(__file__).resolve().parents[3] / "build" / "artefacts" / "console"
CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium() -> str | None:
    given = os.environ.get("DCPKV_CHROMIUM")
    if given:
        return given
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p is not None), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium()
    if executable is None:
        pytest.skip("no chromium: install Debian's (apt-get install chromium); make test does")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable)
        yield launched
        launched.close()


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Callable[[Any, str], Path]:
    """``shots(page, name)``: a full-page PNG under build/artefacts/console/, named by test."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)

    def take(page: Any, name: str) -> Path:
        path = ARTEFACTS / f"{request.node.name}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
