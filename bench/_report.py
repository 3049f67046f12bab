"""The one output of every benchmark: ``NAME VALUE UNIT`` lines, the same figures as JSON, and
the machine yardstick around them (``bench/README.md`` documents the format).

Theory of operation
-------------------
A benchmark's ``__main__`` runs :func:`bench_main` (in place of ``typer.run``): it times the
yardstick (``bench/yardstick.py``, in a fresh process) before the benchmark and again after
it. The benchmark hands its figures to :func:`write_json` as it always has
(``{metric: value}``: metric names say their unit, see :func:`unit_of`); under
:func:`bench_main` they are held until the second timing is in, then printed as one block and
written to ``--json PATH`` (nothing is written without it)::

    # codec: NAME VALUE UNIT (bench/README.md)
    codec.yardstick_start 1234567 frames/s
    codec.yardstick_end 1200000 frames/s
    codec.encode_msgs_per_s 2345678 msgs/s
    codec.encode_msgs_per_s/yardstick 1.925 x
    ...

Every throughput (a unit per second) also gets its ratio to the yardstick (the mean of the two
timings), and to a peer that ran in the same benchmark (``memcached_X`` beside ``X``) as
``X/memcached``. A run whose two timings differ by more than :data:`DRIFT_LIMIT` says so in a
``# WARNING`` line at the top of the block. The JSON holds the same:
``{"bench", "figures", "units", "ratios", "yardstick": {"start", "end", "unit"}, ...}``, and
whatever else the benchmark keeps (phases, parameters, a peer's figures) beside them.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

YARDSTICK = Path(__file__).with_name("yardstick.py")
YARDSTICK_UNIT = "frames/s"
DRIFT_LIMIT = 0.20  # the two yardstick timings of one run may differ by this much
PEERS = ("memcached", "redis", "postgresql")  # prefixes of a same-benchmark peer's figures
RATIO = "x"

# The unit of a metric name's token, where one is a unit (``lag_p50_ms_10k`` is in ms).
_UNIT_TOKENS = {"ms": "ms", "s": "s", "us": "us", "mb": "MB", "mib": "MiB", "kb": "kB",
                "bytes": "B"}  # fmt: skip


def unit_of(metric: str) -> str:
    """The unit a metric's name says (``set_ops_per_s_1conn``: ops/s; ``p99_ms``: ms)."""
    tokens = metric.split("_")
    pers = [i for i, t in enumerate(tokens[1:-1], 1) if t == "per"]
    if pers:
        # ``flush_64vb_txn_per_vb_items_per_s``: the rate's "per s", not a layout's "per vb"
        at = next((i for i in pers if tokens[i + 1] == "s"), pers[0])
        what, per = tokens[at - 1], tokens[at + 1]
        what = _UNIT_TOKENS.get(what, what)
        return f"{what}/{per}"
    if "over" in tokens or "vs" in tokens:
        return RATIO
    if "rate" in tokens:
        return "ops/s"
    for token in reversed(tokens):
        if token in _UNIT_TOKENS:
            return _UNIT_TOKENS[token]
    return "fraction" if "fraction" in tokens else "count"


def is_throughput(unit: str) -> bool:
    return unit.endswith("/s")


def fmt_value(value: float) -> str:
    """A plain decimal: integers from 1,000 up, else 4 significant digits (no exponent)."""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if abs(value) >= 1000 or value == int(value):
        return f"{value:.0f}"
    digits = 3 - math.floor(math.log10(abs(value)))
    return f"{value:.{min(digits, 9)}f}"


def drift(start: float, end: float) -> float:
    """How far apart two yardstick timings are: larger / smaller - 1."""
    return max(start, end) / min(start, end) - 1


@dataclass
class Figures:
    """One benchmark's figures, units and ratios: what it prints and what its JSON holds."""

    bench: str
    figures: dict[str, float]
    yardstick: tuple[float, float] | None = None  # (start, end), frames/s
    units: dict[str, str] = field(init=False)
    ratios: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.units = {m: unit_of(m) for m in self.figures}
        self.ratios = {}
        for metric, value in self.figures.items():
            if not is_throughput(self.units[metric]):
                continue
            if self.yardstick is not None:
                self.ratios[f"{metric}/yardstick"] = value / (sum(self.yardstick) / 2)
            for peer in PEERS:
                theirs = self.figures.get(f"{peer}_{metric}")
                if theirs:
                    self.ratios[f"{metric}/{peer}"] = value / theirs

    def lines(self) -> list[str]:
        out = [f"# {self.bench}: NAME VALUE UNIT (bench/README.md)"]
        rows: list[tuple[str, float, str]] = []
        if self.yardstick is not None:
            start, end = self.yardstick
            if drift(start, end) > DRIFT_LIMIT:
                out.insert(0, f"# WARNING: the yardstick moved {drift(start, end):.0%} during "
                              f"{self.bench} ({start:,.0f} -> {end:,.0f} {YARDSTICK_UNIT}): the "
                              "machine changed speed, its ratios are uncertain")  # fmt: skip
            rows += [("yardstick_start", start, YARDSTICK_UNIT),
                     ("yardstick_end", end, YARDSTICK_UNIT)]  # fmt: skip
        for metric, value in self.figures.items():
            rows.append((metric, value, self.units[metric]))
            rows += [(r, v, RATIO) for r, v in self.ratios.items() if r.startswith(metric + "/")]
        return out + [f"{self.bench}.{name} {fmt_value(float(v))} {unit}" for name, v, unit in rows]

    def json(self, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"bench": self.bench, "figures": self.figures,
                                "units": self.units, "ratios": self.ratios}  # fmt: skip
        if self.yardstick is not None:
            start, end = self.yardstick
            body["yardstick"] = {"start": start, "end": end, "unit": YARDSTICK_UNIT}
        return body | extra


def yardstick_rate() -> float:
    """The yardstick now, in a fresh process: frames/s."""
    done = subprocess.run([sys.executable, str(YARDSTICK), "--value"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return float(done.stdout)


@dataclass
class _Held:
    path: Path | None
    bench: str
    figures: dict[str, float]
    extra: dict[str, Any]


_held: list[_Held] | None = None  # under bench_main: the figures waiting for the end timing


def _emit(held: _Held, yardstick: tuple[float, float] | None) -> None:
    figures = Figures(held.bench, held.figures, yardstick)
    print("\n".join(figures.lines()), flush=True)
    if held.path is not None:
        held.path.parent.mkdir(parents=True, exist_ok=True)
        held.path.write_text(json.dumps(figures.json(**held.extra), indent=2) + "\n")


def write_json(path: Path | None, bench: str, figures: dict[str, float], **extra: Any) -> None:
    """A benchmark's figures: printed, and written to ``path`` when given (the ``--json``
    option); under :func:`bench_main` once the yardstick's second timing is in."""
    held = _Held(path, bench, dict(figures), extra)
    if _held is None:
        _emit(held, None)
    else:
        _held.append(held)


def bench_main(main: Callable[..., Any]) -> None:
    """``typer.run(main)`` between two timings of the yardstick (module docstring)."""
    global _held
    if "--help" in sys.argv[1:]:
        typer.run(main)  # (exits: nothing to time)
    _held = []
    start = yardstick_rate()
    print(f"yardstick at start: {start:,.0f} {YARDSTICK_UNIT}", flush=True)
    try:
        typer.run(main)
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
    end = yardstick_rate()
    print(f"yardstick at end: {end:,.0f} {YARDSTICK_UNIT}", flush=True)
    for held in _held:
        _emit(held, (start, end))
