"""dcpkv.core.logs: the two line formats, events with their fields, levels, counts."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from dcpkv.core import logs


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, list[logging.Handler], int]]:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    out = io.StringIO()
    yield out, saved, level
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved:
        root.addHandler(handler)
    root.setLevel(level)


def test_a_json_line_carries_the_event_and_its_fields(
    captured: tuple[io.StringIO, object, int],
) -> None:
    out = captured[0]
    logs.configure("info", "json", out)
    log = logging.getLogger("dcpkv.test")
    logs.event(log, "failover", "failed over %s", "h:1", node="h:1", promoted=3)
    log.info("a plain line\nwith a newline")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # one object per line, whatever the message holds
    first, second = map(json.loads, lines)
    assert first["event"] == "failover" and first["level"] == "info"
    assert first["message"] == "failed over h:1"
    assert (first["node"], first["promoted"], first["logger"]) == ("h:1", 3, "dcpkv.test")
    assert first["time"].endswith("Z")
    assert "event" not in second and second["message"] == "a plain line\nwith a newline"


def test_a_text_line_ends_with_the_fields(captured: tuple[io.StringIO, object, int]) -> None:
    out = captured[0]
    logs.configure("debug", "text", out)
    logs.event(logging.getLogger("x"), "disk_fault", "flush failed", error="EIO", vbucket=3)
    line = out.getvalue().rstrip()
    assert line.endswith("INFO flush failed event=disk_fault error=EIO vbucket=3")


@pytest.mark.parametrize(
    ("level", "shown"),
    [("debug", 3), ("info", 2), ("warning", 1), ("error", 0), ("WARNING", 1)],
)
def test_the_level_chosen_hides_the_lines_below_it(
    captured: tuple[io.StringIO, object, int], level: str, shown: int
) -> None:
    out = captured[0]
    logs.configure(level, "json", out)
    log = logging.getLogger("dcpkv.test")
    log.debug("d")
    logs.event(log, "rollback", "r", vbucket=1)
    log.warning("w")
    assert len(out.getvalue().splitlines()) == shown


def test_events_are_counted_even_when_not_shown(captured: tuple[io.StringIO, object, int]) -> None:
    logs.configure("error", "text", captured[0])
    before = logs.event_counts()
    log = logging.getLogger("dcpkv.test")
    logs.event(log, "rebalance_end", "done", result="done")
    logs.event(log, "rebalance_end", "failed", result="failed")
    after = logs.event_counts()
    assert after["rebalance_end"] - before.get("rebalance_end", 0) == 2
    assert after["rebalance_end:done"] - before.get("rebalance_end:done", 0) == 1
    assert captured[0].getvalue() == ""


@pytest.mark.parametrize(("level", "fmt"), [("verbose", "json"), ("info", "xml"), ("", "text")])
def test_an_unknown_level_or_format_is_refused(level: str, fmt: str) -> None:
    with pytest.raises(logs.LogSettingsError, match="must be one of"):
        logs.check(level, fmt)
