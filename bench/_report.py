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

Every throughput (a unit per second) also gets its ratio to the yardstick (but an
``achieved_`` rate: a paced writer's, set by its pace), and to a peer that ran in the same
benchmark (``memcached_X`` beside ``X``) as ``X/memcached``.

Which yardstick a figure is divided by: this host changes speed within seconds, so two timings
at a benchmark's start and end do not say how fast it was while one figure of a long
benchmark was measured. A benchmark therefore brackets the code that measures a figure:

* ``with window("set_ops_per_s"):`` times the yardstick (a short sample,
  :data:`SAMPLE_ROUNDS` rounds, in a fresh process) just before and just after the block;
  the figure's ratio is over the higher of the two (:attr:`Sample.speed`);
* ``rounds(n, measure)`` runs ``measure() -> {metric: value}`` ``n`` times, each between two
  samples, and returns the median of each metric; its ratio is the median of the rounds'
  ratios (a burst of other work moves one round, not the median). Short figures use it.

A figure is bound by one resource, and is divided by that resource's yardstick
(``bench/yardstick.py --kind``): ``cpu`` by default; ``window(..., bound="latency")`` for a
rate set by wake-ups (one connection's stop-and-wait); ``bound=MEMORY`` divides by the memory
chase's speed (no benchmark does today: ``bench/README.md`` says why). Its ratio is
named after that yardstick (:func:`ratio_name`: ``rate/yardstick``, ``rate/latency_yardstick``,
``rate/memory_yardstick``).

A figure with neither is divided by the higher of the benchmark's two (cpu) timings (where
the probe below ran: by its speed over the benchmark).

A rate set by one of the server's own timers is divided by no yardstick
(``window(..., bound=TIMER)`` times nothing): a SyncWrite at a persistence level, or a client
polling until its write is persisted, waits for the flusher's next pass (every
``flush_interval_s``), so with 1 or 16 in flight its rate is that interval's (three runs on two
days: within 10 %, while the latency yardstick moved 1.4x between them). Such a figure has no
ratio; ``bench/compare.py`` holds the figure itself to the 20 %.

The probe: a sample around a figure sees the machine for a tenth of a second, not while the
figure ran, and this host's CPUs switch between two speeds (about 1.3M and 0.8M frames/s) in
phases of tens to hundreds of milliseconds. So :func:`bench_main` also runs
``bench/yardstick.py --probe`` for the whole benchmark: a process at the lowest priority that
times a burst of the cpu yardstick's workload (~2 ms) and one of the memory chase (~2.5 ms)
every 0.1 s on the CPU the benchmark kept busiest, by its own CPU time, and logs both
(:data:`PROBED`), with the CPU they ran on and how busy it was. A cpu- or memory-bound figure's
window or round is then divided by the probe's speed of its bound over the time it ran
(:func:`probe_speed`), and a figure without either by the probe's cpu speed over the whole
benchmark. Bursts on a CPU that was mostly idle do not count (:data:`PROBE_BUSY`): they time
its wake-up (about 0.7M frames/s), and a figure whose work keeps no CPU busy (a live stream's
trickle) is not set by the CPU's speed. The samples remain for a span the probe has no burst
in, for the ``moved`` warning, and for latency-bound figures (the probe does not time
wake-ups). Its cpu bursts alone took 2-5 % off a figure that keeps one CPU busy (codec.py's
rates, three runs with and without it), the same in every run; the memory bursts about double
its work. It builds the chase's list first (about a second), and :func:`bench_main` waits for
its first bursts.

A sample can only be made slower than the machine by what runs beside it, never faster. What
a benchmark leaves running (servers exiting, a compaction, the kernel writing back) took up to
0.6x off the samples just after it, so each timing first waits (:func:`settle`, at most
:data:`SETTLE_S`) until the machine's CPUs are idle; and of two samples around a figure the
higher is the machine's speed: a lower one timed a short burst of other work, which a figure
measured over seconds shares out.

A figure's
ratio is *uncertain* when the yardstick moved by more than :data:`DRIFT_LIMIT` around it
(in most of its rounds), or, without a window, during the whole benchmark: such figures are
named in a ``# WARNING`` line at the top of the block and listed under ``moved`` in the JSON.
The JSON holds the same: ``{"bench", "figures", "units", "ratios", "yardstick": {"start",
"end", "unit", "during" (the probe's, over the whole benchmark)}, "windows": {metric: [[before,
after, value or null, the probe's speed or null], ...]}, "bounds": {metric: kind} (figures not
bound by the cpu), "moved": [...], ...}``, and whatever else the benchmark keeps (phases,
parameters, a peer's figures). Beside it, ``NAME.probe.log`` keeps the probe's bursts
(``MONOTONIC FRAMES_PER_S STEPS_PER_S CPU BUSY``), for a question the figures do not answer
(how the bursts spread, not only the fastest of each half second).
Under :func:`bench_main` the benchmark runs on one CPU and the servers it starts on the
others (:mod:`_placement`).
Outside :func:`bench_main` (a test calling a benchmark's function) windows time nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

import _placement
from yardstick import cpu_ticks

YARDSTICK = Path(__file__).with_name("yardstick.py")
YARDSTICK_UNIT = "frames/s"
CPU = "cpu"
TIMER = "timer"  # a rate the server's own timers set: no yardstick (module docstring)
# a bound's yardstick: (its ratio's divisor name, its unit), bench/yardstick.py --kind
MEMORY = "memory"
BOUNDS = {CPU: ("yardstick", YARDSTICK_UNIT), "latency": ("latency_yardstick", "trips/s"),
          MEMORY: ("memory_yardstick", "steps/s")}  # fmt: skip
DRIFT_LIMIT = 0.20  # the two yardstick timings of one run may differ by this much
SETTLE_S = 2.0  # the longest a timing waits for the machine's CPUs to go idle
SETTLE_POLL_S = 0.2
PROBE_BIN_S = 0.5  # the probe's fastest burst in each such slice of a figure's span
IDLE_CPUS = 0.15  # CPUs' worth of work (all CPUs summed) under which the machine is idle
# a window's yardstick sample, by bound: ~0.1 s of the cpu's (the full timing: 9 rounds);
# ~0.3 s of round trips, whose fastest rounds of 5 ranged 1.5x on this host, of 15 1.2x;
# ~0.5 s of the memory chase (after ~1 s building its list)
SAMPLE_ROUNDS = {CPU: 5, "latency": 15, MEMORY: 5}
PROBED = (CPU, MEMORY)  # the bounds the probe times (bench/yardstick.py --probe)
# a probe's burst counts when its CPU was busy this much of the time before it: on an idle CPU
# it times the wake-up (bench/yardstick.py's probe)
PROBE_BUSY = 0.5
PROBE_READY_S = 60.0  # the longest bench_main waits for the probe's first bursts
PEERS = ("memcached", "redis", "postgresql")  # prefixes of a same-benchmark peer's figures
RATIO = "x"
# a paced writer's achieved rate is the pace it was set, not the machine's speed: no ratio to
# the yardstick (it would only move inversely with the yardstick)
PACED = "achieved_"

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


def ratio_name(metric: str, bound: str = CPU) -> str:
    """The name of ``metric``'s ratio to the yardstick of the resource it is bound by."""
    return f"{metric}/{BOUNDS[bound][0]}"


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


@dataclass(frozen=True)
class Sample:
    """The yardstick just before and just after one measurement (and the value measured there,
    when the measurement was a round of :func:`rounds`; and the probe's speed during it, when
    the probe ran: :func:`probe_speed`). ``span``: when the measurement ran (monotonic
    seconds), until the probe's speed for it is known."""

    before: float
    after: float
    value: float | None = None
    during: float | None = None
    span: tuple[float, float] | None = field(default=None, compare=False, repr=False)

    @property
    def speed(self) -> float:
        """The machine's speed during the measurement: the probe's, where it ran; else the
        higher sample around it (module docstring)."""
        return self.during if self.during is not None else max(self.before, self.after)

    @property
    def moved(self) -> bool:
        return drift(self.before, self.after) > DRIFT_LIMIT


def window_yardstick(samples: list[Sample]) -> float:
    """The yardstick a figure measured in ``samples`` goes with: the median of their
    :attr:`Sample.speed`."""
    return statistics.median(s.speed for s in samples)


def _ratio_to_yardstick(value: float, samples: list[Sample]) -> float:
    if all(s.value is not None for s in samples):  # rounds: the median of their ratios
        return statistics.median(s.value / s.speed for s in samples if s.value is not None)
    return value / window_yardstick(samples)


@dataclass
class Figures:
    """One benchmark's figures, units and ratios: what it prints and what its JSON holds."""

    bench: str
    figures: dict[str, float]
    yardstick: tuple[float, float] | None = None  # (start, end), frames/s
    windows: dict[str, list[Sample]] = field(default_factory=dict)  # metric -> its samples
    bounds: dict[str, str] = field(default_factory=dict)  # metric -> its bound, when not cpu
    during: float | None = None  # the probe's speed over the whole benchmark, frames/s
    units: dict[str, str] = field(init=False)
    ratios: dict[str, float] = field(init=False)
    moved: list[str] = field(init=False)  # throughputs whose ratio to the yardstick is uncertain

    def __post_init__(self) -> None:
        self.units = {m: unit_of(m) for m in self.figures}
        self.ratios, self.moved = {}, []
        for metric, value in self.figures.items():
            if not is_throughput(self.units[metric]):
                continue
            if not metric.startswith(PACED):
                self._yardstick_ratio(metric, value)
            for peer in PEERS:
                theirs = self.figures.get(f"{peer}_{metric}")
                if theirs:
                    self.ratios[f"{metric}/{peer}"] = value / theirs

    def _yardstick_ratio(self, metric: str, value: float) -> None:
        samples = self.windows.get(metric)
        if samples:
            name = ratio_name(metric, self.bounds.get(metric, CPU))
            self.ratios[name] = _ratio_to_yardstick(value, samples)
            if sum(s.moved for s in samples) * 2 > len(samples):
                self.moved.append(metric)
        elif self.yardstick is not None and metric not in self.bounds:
            self.ratios[ratio_name(metric)] = value / self.bench_speed()
            if drift(*self.yardstick) > DRIFT_LIMIT:
                self.moved.append(metric)

    def bench_speed(self) -> float:
        """The machine's speed over the whole benchmark: the probe's, else the higher of its
        two timings."""
        assert self.yardstick is not None
        return self.during if self.during is not None else max(self.yardstick)

    def figure_yardstick(self, metric: str) -> float | None:
        """The yardstick a figure's ratio is over: its window's (the median of its samples'
        :attr:`Sample.speed`), else the benchmark's (:meth:`bench_speed`), in the unit of the
        figure's bound (:data:`BOUNDS`)."""
        samples = self.windows.get(metric)
        if samples:
            return window_yardstick(samples)
        if self.yardstick is None or metric in self.bounds:
            return None
        return self.bench_speed()

    def lines(self) -> list[str]:
        out = [f"# {self.bench}: NAME VALUE UNIT (bench/README.md)"]
        if self.moved:
            out.insert(0, f"# WARNING: the yardstick moved over {DRIFT_LIMIT:.0%} while "
                          f"{self.bench} measured {', '.join(self.moved)}: the machine changed "
                          "speed, their ratios are uncertain")  # fmt: skip
        rows: list[tuple[str, float, str]] = []
        if self.yardstick is not None:
            start, end = self.yardstick
            rows += [("yardstick_start", start, YARDSTICK_UNIT),
                     ("yardstick_end", end, YARDSTICK_UNIT)]  # fmt: skip
        for metric, value in self.figures.items():
            rows.append((metric, value, self.units[metric]))
            rows += [(r, v, RATIO) for r, v in self.ratios.items() if r.startswith(metric + "/")]
        return out + [f"{self.bench}.{name} {fmt_value(float(v))} {unit}" for name, v, unit in rows]

    def json(self, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"bench": self.bench, "figures": self.figures,
                                "units": self.units, "ratios": self.ratios,
                                "moved": self.moved}  # fmt: skip
        if self.yardstick is not None:
            start, end = self.yardstick
            body["yardstick"] = {"start": start, "end": end, "unit": YARDSTICK_UNIT}
            if self.during is not None:
                body["yardstick"]["during"] = self.during
        if self.windows:
            body["windows"] = {m: [[s.before, s.after, s.value, s.during] for s in samples]
                               for m, samples in self.windows.items()}  # fmt: skip
        if self.bounds:
            body["bounds"] = self.bounds
        return body | extra


Reading = tuple[float, float]  # a probe burst: (monotonic seconds at its end, its rate)
Readings = dict[str, list[Reading]]  # the probe's bursts by the bound they time (PROBED)


def probe_speed(readings: Iterable[Reading], start: float, end: float) -> float | None:
    """The machine's speed from ``start`` to ``end`` by the probe's bursts: the fastest burst
    of each :data:`PROBE_BIN_S` (other work only slows a burst), averaged over the bins, as a
    figure measured over the span averages the host's speeds. A span shorter than a bin is
    widened to the bin around its middle; None when no burst fell in it."""
    if end - start < PROBE_BIN_S:
        middle = (start + end) / 2
        start, end = middle - PROBE_BIN_S / 2, middle + PROBE_BIN_S / 2
    fastest: dict[int, float] = {}
    for at, speed in readings:
        if start <= at < end:
            slot = int((at - start) / PROBE_BIN_S)
            fastest[slot] = max(speed, fastest.get(slot, 0.0))
    return statistics.fmean(fastest.values()) if fastest else None


def read_probe(path: Path) -> Readings:
    """The probe's bursts so far, by bound, from ``MONOTONIC FRAMES_PER_S STEPS_PER_S CPU
    BUSY`` lines: a line still being written is skipped, and so is a pair timed on a CPU busy
    less than :data:`PROBE_BUSY` of the time before it (it timed a wake-up, not the speed the
    benchmark's work got). The CPU they ran on is for a reader of the log."""
    out: Readings = {bound: [] for bound in PROBED}
    for line in path.read_text(encoding="ascii").split("\n")[:-1]:
        fields = line.split()
        busy = float(fields[4]) if len(fields) > 4 else 1.0
        if len(fields) > len(PROBED) and busy >= PROBE_BUSY:
            at = float(fields[0])
            for bound, rate in zip(PROBED, fields[1:], strict=False):
                out[bound].append((at, float(rate)))
    return out


def _busy_and_total() -> tuple[int, int] | None:
    """(busy, all) clock ticks of every CPU since boot (``yardstick.cpu_ticks``; None without
    ``/proc/stat``)."""
    return cpu_ticks().get("cpu")


def settle(limit: float = SETTLE_S) -> bool:
    """Wait until the machine's CPUs do less than :data:`IDLE_CPUS` of work, at most ``limit``
    seconds: True when they did (module docstring)."""
    cpus = os.cpu_count() or 1
    deadline = time.monotonic() + limit
    last = _busy_and_total()
    while last is not None and time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_S)
        now = _busy_and_total()
        if now is None or now[1] == last[1]:
            return now is not None
        if (now[0] - last[0]) / (now[1] - last[1]) * cpus < IDLE_CPUS:
            return True
        last = now
    return False


def yardstick_rate(rounds: int | None = None, bound: str = CPU) -> float:
    """The yardstick of ``bound`` now, in a fresh process, in its unit (:data:`BOUNDS`;
    ``rounds``: fewer for a sample), once the machine is idle (:func:`settle`)."""
    if not settle():
        print(f"# yardstick: the machine stayed busy for {SETTLE_S:.0f} s, timing it anyway",
              file=sys.stderr, flush=True)  # fmt: skip
    more = [] if rounds is None else ["--rounds", str(rounds)]
    with _placement.everywhere():
        done = subprocess.run([sys.executable, str(YARDSTICK), "--value", "--kind", bound,
                               *more], capture_output=True, text=True, check=True)  # fmt: skip
    return float(done.stdout)


@dataclass
class _Held:
    path: Path | None
    bench: str
    figures: dict[str, float]
    extra: dict[str, Any]


_held: list[_Held] | None = None  # under bench_main: the figures waiting for the end timing
_windows: dict[str, list[Sample]] = {}  # under bench_main: each metric's yardstick samples
_bounds: dict[str, str] = {}  # under bench_main: the metrics not bound by the cpu


def _sample(wanted: bool = True, bound: str = CPU) -> float | None:
    if _held is None or not wanted or bound == TIMER:
        return None
    return yardstick_rate(SAMPLE_ROUNDS[bound], bound)


def _bind(metrics: Iterable[str], bound: str) -> None:
    if bound not in BOUNDS and bound != TIMER:
        raise ValueError(f"no yardstick for {bound!r}: one of {', '.join([*BOUNDS, TIMER])}")
    if bound != CPU:
        _bounds.update(dict.fromkeys(metrics, bound))


@contextmanager
def window(*metrics: str, after: bool = True, bound: str = CPU) -> Iterator[None]:
    """Time ``bound``'s yardstick just before and just after the block that measures
    ``metrics`` (no metrics: nothing is timed). ``after=False``: the sample before stands for
    both, for a figure whose work goes on after it (a sample then would time that work's
    load)."""
    _bind(metrics, bound)
    before = _sample(bool(metrics), bound)
    began = time.monotonic()
    yield
    span = (began, time.monotonic())
    end = _sample(bool(metrics), bound) if after else before
    if before is not None and end is not None:
        record(metrics, before, end, span=span)


def record(
    metrics: Iterable[str],
    before: float,
    after: float,
    bound: str = CPU,
    span: tuple[float, float] | None = None,
) -> None:
    """Yardstick timings taken around ``metrics`` elsewhere (another process's own); ``span``:
    when they were measured (``time.monotonic()``), for the probe."""
    names = list(metrics)
    _bind(names, bound)
    for metric in names:
        _windows.setdefault(metric, []).append(Sample(before, after, span=span))


def record_round(
    figures: dict[str, float],
    before: float,
    after: float,
    span: tuple[float, float] | None = None,
) -> None:
    """One round of ``figures`` measured elsewhere (another process) between yardstick timings
    ``before`` and ``after``: their ratios are the median of their rounds' (:func:`rounds`);
    ``span`` as for :func:`record`."""
    for metric, value in figures.items():
        _windows.setdefault(metric, []).append(Sample(before, after, value, span=span))


@contextmanager
def a_round(
    bound: str = CPU, after: bool = True, wanted: bool = True
) -> Iterator[dict[str, float]]:
    """One round of :func:`rounds` around a block that measures it in place (an ``await``,
    say): the block puts its figures in the dict it is given. ``after=False``: as for
    :func:`window`; ``wanted=False``: the block runs untimed (a figure's round or not, by
    the caller's choice)."""
    figures: dict[str, float] = {}
    before = _sample(wanted, bound)
    began = time.monotonic()
    yield figures
    span = (began, time.monotonic())
    after_ = _sample(wanted, bound) if after else before
    _bind(figures, bound)
    if before is not None and after_ is not None:
        record_round(figures, before, after_, span)


def rounds(
    count: int, measure: Callable[[], dict[str, float]], bound: str = CPU
) -> dict[str, float]:
    """``measure()`` ``count`` times, each between two samples of ``bound``'s yardstick: the
    median of each metric (their ratios: the median of the rounds' ratios, see the module
    docstring)."""
    results = []
    for _ in range(count):
        with a_round(bound) as figures:
            figures.update(measure())
        results.append(figures)
    return {m: statistics.median(r[m] for r in results) for m in results[0]}


def _probed(samples: list[Sample], readings: Sequence[Reading]) -> list[Sample]:
    """``samples`` with the probe's speed over their spans (where it has one)."""
    return [dataclasses.replace(s, during=probe_speed(readings, *s.span))
            if s.span is not None else s for s in samples]  # fmt: skip


def _emit(
    held: _Held,
    yardstick: tuple[float, float] | None,
    readings: Readings | None = None,
    span: tuple[float, float] | None = None,
) -> None:
    readings = readings or {}
    bounds = {m: _bounds[m] for m in held.figures if m in _bounds}
    windows = {m: _probed(_windows[m], readings.get(bounds.get(m, CPU), []))
               for m in held.figures if m in _windows}  # fmt: skip
    during = probe_speed(readings.get(CPU, []), *span) if span is not None else None
    figures = Figures(held.bench, held.figures, yardstick, windows, bounds, during)
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
    _placement.pin_client()
    with tempfile.TemporaryDirectory(prefix="dcpkv-probe-") as tmp, _probe(Path(tmp)) as path:
        _await_probe(path)
        start = yardstick_rate()
        print(f"yardstick at start: {start:,.0f} {YARDSTICK_UNIT}", flush=True)
        began = time.monotonic()
        try:
            typer.run(main)
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise
        span = (began, time.monotonic())
        end = yardstick_rate()
        print(f"yardstick at end: {end:,.0f} {YARDSTICK_UNIT}", flush=True)
        readings = read_probe(path)
        for held in _held:
            if held.path is not None:  # every burst, beside the JSON (module docstring)
                held.path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, held.path.with_suffix(".probe.log"))
    for held in _held:
        _emit(held, (start, end), readings, span)


def _await_probe(path: Path, limit: float = PROBE_READY_S) -> None:
    """Wait until the probe has timed its first bursts (it builds its memory chase's list
    first, and that work would slow the yardstick's first timing), at most ``limit``
    seconds: a probe that never starts leaves every figure its samples' ratio."""
    deadline = time.monotonic() + limit
    while "\n" not in path.read_text(encoding="ascii"):  # (on an idle machine none counts)
        if time.monotonic() > deadline:
            print(f"# the probe timed nothing in {limit:.0f} s: figures go with their samples",
                  file=sys.stderr, flush=True)  # fmt: skip
            return
        time.sleep(0.1)


@contextmanager
def _probe(folder: Path) -> Iterator[Path]:
    """``bench/yardstick.py --probe`` running for the block: the file its bursts go to."""
    path = folder / "probe.log"
    path.touch()
    with _placement.everywhere():
        probe = subprocess.Popen([sys.executable, str(YARDSTICK), "--probe", str(path)],
                                 stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        yield path
    finally:
        probe.terminate()
        probe.wait()
