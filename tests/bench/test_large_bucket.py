"""``bench/large_bucket.py``'s figure names and ``bench/kv_growth.py --keep``, the folder the
first leaves for the second. No benchmark is run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _report  # noqa: E402  (bench/ is a folder of scripts, not a package)
import kv_growth  # noqa: E402
import large_bucket  # noqa: E402


def test_each_large_bucket_figure_says_its_unit_and_only_the_rates_are_throughputs() -> None:
    names = ["value_only_warmup_s", "value_only_rss_mib", "full_eviction_warmup_s",
             *large_bucket.ROWS]  # fmt: skip
    units = {name: _report.unit_of(name) for name in names}
    assert units == {
        "value_only_warmup_s": "s",
        "value_only_rss_mib": "MiB",
        "full_eviction_warmup_s": "s",
        "random_get_ops_per_s_1conn": "ops/s",
        "random_get_ops_per_s_4conn": "ops/s",
        "missing_get_ops_per_s_4conn": "ops/s",
        "random_get_server_cpu_us_per_get_1conn": "us/get",
        "random_get_server_cpu_us_per_get_4conn": "us/get",
        "missing_get_server_cpu_us_per_get_4conn": "us/get",
        "full_eviction_rss_mib": "MiB",
    }
    throughputs = {name for name, unit in units.items() if _report.is_throughput(unit)}
    assert throughputs == {n for n in names if "_ops_per_s_" in n}


def test_kv_growth_keeps_a_new_or_empty_folder_and_leaves_it(tmp_path: Path) -> None:
    keep = tmp_path / "new"
    with kv_growth._folder(keep) as folder:
        assert folder == str(keep)
        (keep / "data").mkdir()
    assert (keep / "data").is_dir()


def test_kv_growth_refuses_to_keep_a_folder_that_holds_something(tmp_path: Path) -> None:
    (tmp_path / "old").write_text("")
    with pytest.raises(typer.BadParameter, match="not empty"):
        kv_growth._folder(tmp_path)


def test_large_bucket_without_kv_growths_bucket_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "large_bucket.py"), "--data-dir", str(tmp_path),
         "--items", "10"],
        capture_output=True, text=True, check=False,
        env={**os.environ, "COLUMNS": "1000"},  # typer's error box: one line, whatever the path
    )  # fmt: skip
    assert done.returncode != 0
    assert "kv_growth.py --keep" in done.stderr


@pytest.mark.parametrize(
    ("segments", "first", "last"),
    [(100, [0, 1, 2], [97, 98, 99]), (4, [0, 1], [2, 3]), (1, [0], [0]), (3, [0], [2])],
)
def test_kv_growth_takes_its_first_and_last_figures_from_three_segments_each(
    segments: int, first: list[int], last: list[int]
) -> None:
    ends = kv_growth.end_segments(segments)
    assert (list(ends["first"]), list(ends["last"])) == (first, last)
