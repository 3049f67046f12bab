"""Two runs' ratios side by side: do they agree within 20 %, where the absolute figures do not?

Theory of operation
-------------------
Reads two results folders of ``make bench`` (or of single benchmarks' ``--json``), takes
every ratio both runs wrote (``ratios`` of each ``NAME.json``, see ``bench/_report.py``: a
throughput over the yardstick, or over a peer of the same benchmark), and prints one line per
ratio: ``NAME RATIO_A RATIO_B B/A FIGURE_A FIGURE_B VERDICT``, the verdict ``AGREE`` or
``DIFFER`` (more than :data:`AGREEMENT` apart), ``DIFFER*`` or ``AGREE*`` where the yardstick
moved by more than 20 % around that figure in either run (the benchmark's ``moved``; in files
written before figures had their own windows: during the whole benchmark). Comments then
count them: the ratios to a yardstick (whichever resource's, ``bench/_report.py``), the ratios
to a peer of the same run, and the figures a timer sets. A figure set by the server's own
timers has no ratio (``bench/_report.py``'s ``TIMER``): its line holds the figure itself in
both places (``NAME FIGURE_A FIGURE_B B/A FIGURE_A FIGURE_B VERDICT``). Last, each run's
memory yardstick at its start and end, where it has one (``bench/yardstick.py``).

    .venv/bin/python bench/compare.py RESULTS_A RESULTS_B
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import summary
from _report import BOUNDS, DRIFT_LIMIT, TIMER, drift, fmt_value

AGREEMENT = 0.20


def _benches(results: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(results.glob("*.json")):
        body = json.loads(path.read_text())
        if "ratios" in body:
            out[body["bench"]] = body
    return out


def _moved(body: dict[str, Any], metric: str) -> bool:
    if "moved" in body:
        return metric in body["moved"]
    timings = body.get("yardstick")
    return timings is not None and drift(timings["start"], timings["end"]) > DRIFT_LIMIT


def is_yardstick_ratio(name: str) -> bool:
    """``rate/latency_yardstick``: yes; ``rate/memcached``: no (a peer's)."""
    return name.split("/")[-1] in {divisor for divisor, _unit in BOUNDS.values()}


@dataclass
class Count:
    agree: int = 0
    total: int = 0

    def add(self, ok: bool) -> None:
        self.agree, self.total = self.agree + ok, self.total + 1


def _timed(body_a: dict[str, Any], body_b: dict[str, Any], count: Count) -> Iterator[str]:
    """The lines of the figures both runs say a timer sets, each held to the 20 % itself."""
    bounds_a, bounds_b = body_a.get("bounds", {}), body_b.get("bounds", {})
    for metric in sorted(m for m, b in bounds_a.items() if b == TIMER and bounds_b.get(m) == TIMER):
        fa, fb = body_a["figures"].get(metric), body_b["figures"].get(metric)
        if not fa or not fb:
            continue
        ok = drift(fa, fb) <= AGREEMENT
        count.add(ok)
        values = (fa, fb, fb / fa, fa, fb)
        yield (f"{body_a['bench']}.{metric} {' '.join(fmt_value(v) for v in values)} "
               f"{'AGREE' if ok else 'DIFFER'}")  # fmt: skip


def compare(a: Path, b: Path) -> tuple[list[str], Count, Count, Count]:
    """The lines, and how many agree of how many: ratios to a yardstick, ratios to a peer,
    figures a timer sets."""
    runs_a, runs_b = _benches(a), _benches(b)
    lines: list[str] = []
    yardsticks, peers, timers = Count(), Count(), Count()
    for bench in sorted(runs_a.keys() & runs_b.keys()):
        body_a, body_b = runs_a[bench], runs_b[bench]
        lines += _timed(body_a, body_b, timers)
        for name in body_a["ratios"].keys() & body_b["ratios"].keys():
            ra, rb = body_a["ratios"][name], body_b["ratios"][name]
            if not ra or not rb:
                continue
            metric = name.split("/")[0]
            moved = "*" if _moved(body_a, metric) or _moved(body_b, metric) else ""
            fa, fb = body_a["figures"][metric], body_b["figures"][metric]
            ok = drift(ra, rb) <= AGREEMENT
            (yardsticks if is_yardstick_ratio(name) else peers).add(ok)
            values = (ra, rb, rb / ra, fa, fb)
            lines.append(f"{bench}.{name} {' '.join(fmt_value(v) for v in values)} "
                         f"{'AGREE' if ok else 'DIFFER'}{moved}")  # fmt: skip
    return sorted(lines), yardsticks, peers, timers


def memory_yardsticks(results: Path) -> list[float]:
    """The memory yardstick of a results folder at its start and end, where it has them."""
    return summary.memory_yardsticks(summary.load(results))


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    lines, yardsticks, peers, timers = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    print("# NAME RATIO_A RATIO_B B/A FIGURE_A FIGURE_B VERDICT (bench/compare.py)")
    print("\n".join(lines))
    for count, what in ((yardsticks, "ratios to a yardstick"), (peers, "ratios to a peer"),
                        (timers, "figures a timer sets")):  # fmt: skip
        print(f"# {count.agree} of {count.total} {what} agree within {AGREEMENT:.0%}")
    for name, results in (("A", sys.argv[1]), ("B", sys.argv[2])):
        memory = memory_yardsticks(Path(results))
        if memory:
            rates = " -> ".join(f"{m:,.0f}" for m in memory)
            print(f"# memory yardstick of {name}: {rates} steps/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
