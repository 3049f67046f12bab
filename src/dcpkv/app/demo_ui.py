"""The main job's terminal: signals, the live line and its figures, the load's progress bar.

The job's phases (``demo.py``) look at :class:`Stopper` between steps; the callbacks of the
pipelines' batches fill :class:`PipelineStats` (on Spark's listener thread, hence its lock);
:func:`live_line` redraws :func:`progress_line` in place on a terminal, or prints it every
few seconds into a log.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.progress import ProgressColumn, Task
from rich.text import Text

TICK_S = 0.5
PLAIN_LINE_EVERY_S = 5.0  # without a terminal, the progress line is printed this often
RATE_WINDOW_S = 10.0


class Stopper:
    """First SIGINT/SIGTERM: set :attr:`event`. Second: ``KeyboardInterrupt``."""

    def __init__(self, console: Console) -> None:
        self.event = threading.Event()
        self.console = console
        self.forced = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.event.is_set():
            self.forced = True
            raise KeyboardInterrupt
        self.event.set()
        name = signal.Signals(signum).name
        self.console.print(f"[yellow]{name}: stopping cleanly (again to skip the catch-up)")

    @property
    def stopped(self) -> bool:
        return self.event.is_set()


@dataclass
class PipelineStats:
    """What the ``on_batch`` callbacks of one query told us (callbacks run on Spark's
    listener thread, hence the lock)."""

    batches: int = 0
    query_batches: int = 0  # batches of the Spark query (not a first batch the driver wrote)
    rows: int = 0
    lag: int | None = None
    lag_s: float | None = None  # the last batch's oldest change: write to commit (BatchStats)
    recent: deque[tuple[float, int]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_batch(self, stats: Any) -> None:
        now = time.monotonic()
        with self.lock:
            self.batches += 1
            self.query_batches += stats.batch_id >= 0
            self.rows += stats.rows
            self.lag = stats.lag
            self.lag_s = stats.lag_s
            self.recent.append((now, stats.rows))
            while self.recent and self.recent[0][0] < now - RATE_WINDOW_S:
                self.recent.popleft()

    def rate(self, since: float) -> float:
        now = time.monotonic()
        window = max(1.0, min(RATE_WINDOW_S, now - since))
        with self.lock:
            return sum(rows for at, rows in self.recent if at >= now - window) / window


@dataclass
class Sampled:
    docs: int | None = None
    groups: int | None = None


class RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f} docs/s", style="progress.data.speed")


def progress_line(
    started: float, mirror: PipelineStats, view: PipelineStats, sampled: Sampled, written: int,
    chaos: str | None = None,
) -> str:  # fmt: skip
    """The live line: batches, rows/s and lag of the mirror, the view's, changes written."""
    elapsed = int(time.monotonic() - started)
    lag = "-" if mirror.lag is None else f"{mirror.lag:,}"
    lag += "" if mirror.lag_s is None else f" ({mirror.lag_s:.1f} s)"
    docs = "-" if sampled.docs is None else f"{sampled.docs:,}"
    groups = "-" if sampled.groups is None else f"{sampled.groups}"
    return (
        f"{elapsed // 60:02d}:{elapsed % 60:02d}  mirror: {mirror.batches} batches, "
        f"{mirror.rate(started):,.0f} rows/s, lag {lag}, {docs} docs mirrored  |  "
        f"view: {view.batches} batches, {groups} groups  |  {written:,} changes written"
        + ("" if chaos is None else f"  |  {chaos}")
    )


def live_line(
    line: Callable[[], str], stopper: Stopper, duration: float | None, started: float,
    console: Console, queries: list[Any],
) -> None:  # fmt: skip
    """Redraw the progress line until a signal, the duration, or a query's failure."""
    deadline = None if duration is None else started + duration
    last_plain = started
    live = Live(Text(line()), console=console, transient=False) if console.is_terminal else None
    with live if live is not None else contextlib.nullcontext():
        while not stopper.event.wait(TICK_S):
            now = time.monotonic()
            if live is not None:
                live.update(Text(line()))
            elif now - last_plain >= PLAIN_LINE_EVERY_S:
                console.print(line())
                last_plain = now
            if deadline is not None and now >= deadline:
                return
            failed = [q for q in queries if not q.isActive]
            if failed:
                console.print(f"[red]a query stopped: {failed[0].exception()}")
                return
