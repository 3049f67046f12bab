"""``dcpkv pipeline report``: a pipeline's per-batch metrics drawn as a PNG.

Theory of operation
-------------------
The mirror and the views append one JSON line per micro-batch to ``<dir>/_metrics.jsonl``
(the fields of :class:`~dcpkv.pipelines.mirror.BatchStats`: ``batch_id``, ``finished_at``
(Unix time), ``rows``, ``rollbacks``, ``seconds`` (the batch's wall time), ``lag`` (changes
the batch left behind the server's high seqnos, or null when unknown) and ``lag_s`` (seconds
from the write of the batch's oldest change to its commit, null without one). The report
reads those lines, each directory one series, and draws four panels sharing one time axis
(seconds since the first batch started): throughput (rows per second of batch time), lag in
changes, lag in seconds, and rows per batch. Markers make isolated batches visible; a batch
without a lag leaves a gap in that line. ``marks`` (Unix time, label), e.g. the failovers of
``dcpkv demo --chaos``, are drawn as vertical lines across the panels, labelled on the first.

A half-written last line (a pipeline still running) is skipped, not an error. matplotlib
runs on its Agg backend: no display is needed, and nothing is imported before the command
is actually used.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcpkv.core.errors import DcpkvError

METRICS_FILE = "_metrics.jsonl"
LOG_SCALE_SPREAD = 50


class ReportError(DcpkvError, RuntimeError):
    """Nothing to draw: no metrics file, or no batch in it."""


@dataclass(frozen=True)
class Series:
    """One pipeline's batches, in the order they finished."""

    label: str
    started: list[float]  # Unix time each batch started
    finished: list[float]
    rows: list[int]
    seconds: list[float]
    lag: list[float | None]
    lag_s: list[float | None]

    @property
    def rates(self) -> list[float]:
        return [r / s if s > 0 else 0.0 for r, s in zip(self.rows, self.seconds, strict=True)]


def read_series(directory: Path, label: str | None = None) -> Series:
    """The batches of ``directory/_metrics.jsonl``."""
    path = directory / METRICS_FILE
    if not path.is_file():
        raise ReportError(f"no {METRICS_FILE} in {directory}")
    batches = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            batches.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the line a running pipeline is writing
    batches = [b for b in batches if isinstance(b, dict) and "finished_at" in b]
    if not batches:
        raise ReportError(f"{path} holds no batch yet")
    batches.sort(key=lambda b: float(b["finished_at"]))
    seconds = [float(b.get("seconds") or 0.0) for b in batches]
    finished = [float(b["finished_at"]) for b in batches]
    return Series(
        label=label or directory.name,
        started=[f - s for f, s in zip(finished, seconds, strict=True)],
        finished=finished,
        rows=[int(b.get("rows") or 0) for b in batches],
        seconds=seconds,
        lag=_optional(batches, "lag"),
        lag_s=_optional(batches, "lag_s"),
    )


def _optional(batches: list[dict[str, Any]], name: str) -> list[float | None]:
    return [None if b.get(name) is None else float(b[name]) for b in batches]


def draw_report(
    directories: list[Path], out: Path, title: str | None = None,
    marks: Sequence[tuple[float, str]] = (),
) -> Path:  # fmt: skip
    """Draw the metrics of ``directories`` (one series each) into the PNG ``out``, with a
    vertical line at each of ``marks`` (Unix time, label)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [read_series(d) for d in directories]
    origin = min(s.started[0] for s in series)
    fig, (ax_rate, ax_lag, ax_lag_s, ax_rows) = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    for s in series:
        t = [f - origin for f in s.finished]
        ax_rate.plot(t, s.rates, marker="o", markersize=3, label=s.label)
        for ax, values in ((ax_lag, s.lag), (ax_lag_s, s.lag_s)):
            ax.plot(t, [float("nan") if v is None else v for v in values], marker="o",
                    markersize=3, label=s.label)  # fmt: skip
        ax_rows.plot(t, s.rows, marker="o", markersize=3, drawstyle="steps-mid", label=s.label)
    _mark(ax_rate, ax_lag, ax_lag_s, ax_rows, marks=[(at - origin, text) for at, text in marks])
    _label(ax_rate, "Throughput", "rows / second of batch time", [s.rates for s in series])
    _label(ax_lag, "Lag after each batch", "changes behind the server", [s.lag for s in series])
    _label(ax_lag_s, "Lag of each batch: its oldest change's write to its commit", "seconds",
           [s.lag_s for s in series])  # fmt: skip
    _label(ax_rows, "Rows per batch", "rows", [s.rows for s in series])
    ax_rows.set_xlabel("time since the first batch started (seconds)")
    fig.suptitle(title or "dcpkv pipeline metrics: " + ", ".join(s.label for s in series))
    fig.text(0.5, 0.005, _summary(series), ha="center", va="bottom", fontsize=9, color="0.3")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _mark(ax_top: Any, *others: Any, marks: list[tuple[float, str]]) -> None:
    for i, (t, text) in enumerate(marks):
        for ax in (ax_top, *others):
            ax.axvline(t, color="tab:red", linestyle="--", linewidth=1,
                       label=text.split(" ")[0] if ax is ax_top and i == 0 else None)  # fmt: skip
        ax_top.annotate(text, (t, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                        va="top", ha="right", fontsize=7, color="tab:red")  # fmt: skip


def _label(ax: Any, title: str, unit: str, values: list[list[Any]]) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_title(title, loc="left", fontsize=11)
    positive = sorted(v for vs in values for v in vs if v is not None and v > 0)
    # The initial load's batch is often 100x the live ones: a linear axis would flatten the
    # live part to the floor, so a wide spread gets a log axis (and says so).
    if positive and positive[-1] > LOG_SCALE_SPREAD * positive[len(positive) // 2]:
        ax.set_yscale("log")
        unit += " (log scale)"
    else:
        ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    ax.set_ylabel(unit)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)


def _summary(series: list[Series]) -> str:
    parts = []
    for s in series:
        lags = [v for v in s.lag if v is not None]
        last_lag = f"{lags[-1]:.0f}" if lags else "n/a"
        seconds = sorted(v for v in s.lag_s if v is not None)
        lag_s = f", lag p50 {seconds[len(seconds) // 2]:.1f} s" if seconds else ""
        parts.append(
            f"{s.label}: {len(s.rows)} batches, {sum(s.rows):,} rows, "
            f"max lag {max(lags, default=0):.0f}, final lag {last_lag}{lag_s}"
        )
    return "   |   ".join(parts)
