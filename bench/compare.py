"""Two runs' ratios side by side: do they agree within 20 %, where the absolute figures do not?

Theory of operation
-------------------
Reads two results folders of ``make bench`` (or of single benchmarks' ``--json``), takes
every ratio both runs wrote (``ratios`` of each ``NAME.json``, see ``bench/_report.py``: a
throughput over the yardstick, or over a peer of the same benchmark), and prints one line per
ratio: ``NAME RATIO_A RATIO_B B/A FIGURE_A FIGURE_B VERDICT``, the verdict ``AGREE`` or
``DIFFER`` (more than :data:`AGREEMENT` apart), ``DIFFER*`` or ``AGREE*`` where the yardstick
moved by more than 20 % around that figure in either run (the benchmark's ``moved``; in files
written before figures had their own windows: during the whole benchmark). The last line, a
comment, counts them.

    .venv/bin/python bench/compare.py RESULTS_A RESULTS_B
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from _report import DRIFT_LIMIT, drift, fmt_value

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


def compare(a: Path, b: Path) -> tuple[list[str], int, int]:
    """The lines, how many ratios agree and how many there are."""
    runs_a, runs_b = _benches(a), _benches(b)
    lines, agree, total = [], 0, 0
    for bench in sorted(runs_a.keys() & runs_b.keys()):
        body_a, body_b = runs_a[bench], runs_b[bench]
        for name in body_a["ratios"].keys() & body_b["ratios"].keys():
            ra, rb = body_a["ratios"][name], body_b["ratios"][name]
            if not ra or not rb:
                continue
            metric = name.split("/")[0]
            moved = "*" if _moved(body_a, metric) or _moved(body_b, metric) else ""
            fa, fb = body_a["figures"][metric], body_b["figures"][metric]
            ok = drift(ra, rb) <= AGREEMENT
            agree, total = agree + ok, total + 1
            values = (ra, rb, rb / ra, fa, fb)
            lines.append(f"{bench}.{name} {' '.join(fmt_value(v) for v in values)} "
                         f"{'AGREE' if ok else 'DIFFER'}{moved}")  # fmt: skip
    return sorted(lines), agree, total


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    lines, agree, total = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    print("# NAME RATIO_A RATIO_B B/A FIGURE_A FIGURE_B VERDICT (bench/compare.py)")
    print("\n".join(lines))
    print(f"# {agree} of {total} ratios agree within {AGREEMENT:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
