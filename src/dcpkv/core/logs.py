"""Log lines an operator reads or a log shipper parses: text or JSON, one line per event.

Theory of operation
-------------------
Data nodes (``dcpkv server``) and managers (``dcpkv manager``) log to stderr through
:func:`configure`, at the level the user gives (``--log-level``: debug, info, warning,
error) and in one of two formats (``--log-format``):

``text``  ``2026-11-27 10:15:02,117 WARNING failed over ... event=failover node=127.0.0.1:40001``
``json``  ``{"time": "2026-11-27T10:15:02.117Z", "level": "info", "logger": "dcpkv.cluster",
          "event": "failover", "message": "failed over ...", "node": "127.0.0.1:40001", ...}``

An event that matters to an operator is logged with :func:`event`: a name from
:data:`EVENTS` and its fields (plain values), so a JSON line carries them as keys of its own
and a text line ends with ``event=NAME`` and ``key=value`` pairs. Any other line has no
``event`` key. Events are counted (:func:`event_counts`) whether or not their level is shown.
A JSON line is one object on one line whatever the message holds (newlines are escaped), so a
line reader never splits one.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from typing import IO, Any

from dcpkv.core.errors import DcpkvError

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")

# The events :func:`event` logs, and what each means.
EVENTS = {
    "failover": "a node was failed over (by hand or automatically)",
    "failover_refused": "an automatic failover was not done, and why",
    "rebalance_start": "a rebalance started",
    "rebalance_step": "a vbucket move of a rebalance ended (moved or failed)",
    "rebalance_end": "a rebalance ended: done, stopped or failed",
    "rollback": "a replica vbucket rolled back to follow its active",
    "auth_failure": "a login or an HTTP request was refused for its credentials",
    "disk_fault": "a flush to disk failed (writes answer TempFail until one succeeds)",
    "disk_recovered": "a flush succeeded again after a disk fault",
}

_COUNTS: Counter[str] = Counter()  # events logged by this process, whatever the level shown
_EVENT = "dcpkv_event"  # the LogRecord attributes event() sets
_FIELDS = "dcpkv_fields"
_TEXT = "%(asctime)s %(levelname)s %(message)s"


class LogSettingsError(DcpkvError, ValueError):
    """A log level or format that does not exist."""


def event(log: logging.Logger, name: str, message: str, *args: object, level: int = logging.INFO,
          **fields: object) -> None:  # fmt: skip
    """Log the event ``name`` (one of :data:`EVENTS`) with ``message % args`` and ``fields``."""
    assert name in EVENTS, name
    _COUNTS[name] += 1
    if "result" in fields:  # (rebalance_end: done, stopped or failed, counted apart)
        _COUNTS[f"{name}:{fields['result']}"] += 1
    log.log(level, message, *args, extra={_EVENT: name, _FIELDS: fields})


def event_counts() -> dict[str, int]:
    """How many times this process logged each event (the manager's metrics count failovers
    and rebalances so)."""
    return dict(_COUNTS)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, event, message, the
    event's fields, and the traceback of an exception logged with it."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        name = getattr(record, _EVENT, None)
        if name is not None:
            doc["event"] = name
        doc["message"] = record.getMessage()
        for key, value in getattr(record, _FIELDS, {}).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """The classic line, then the event's name and fields as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(_TEXT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        name = getattr(record, _EVENT, None)
        if name is None:
            return line
        head, sep, rest = line.partition("\n")  # (a traceback stays below the line)
        fields = {"event": name, **getattr(record, _FIELDS, {})}
        pairs = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"{head} {pairs}{sep}{rest}"


def check(level: str, fmt: str) -> None:
    """LogSettingsError when ``level`` or ``fmt`` is not one of :data:`LEVELS` / :data:`FORMATS`."""
    if level.lower() not in LEVELS:
        raise LogSettingsError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    if fmt.lower() not in FORMATS:
        raise LogSettingsError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def configure(level: str = "info", fmt: str = "text", stream: IO[str] | None = None) -> None:
    """The root logger writes ``fmt`` lines at ``level`` and above to ``stream`` (stderr)."""
    check(level, fmt)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt.lower() == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
