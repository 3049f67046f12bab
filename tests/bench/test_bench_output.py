"""The benchmarks' one output format (``bench/_report.py``), the yardstick, and the summary's
yardstick warnings and README section (``bench/summary.py``). No benchmark is run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _report  # noqa: E402  (bench/ is a folder of scripts, not a package)
import summary  # noqa: E402
import yardstick  # noqa: E402

# every shape of metric name the benchmarks write, and the unit it says
UNITS = [
    ("set_ops_per_s_1conn", "ops/s"),
    ("parse_decode_msgs_per_s", "msgs/s"),
    ("backfill_mb_per_s", "MB/s"),
    ("achieved_writes_per_s_10k", "writes/s"),
    ("set_server_cpu_us_per_op_4conn", "us/op"),
    ("disk_bytes_per_item", "B/item"),
    ("server_disk_kb_per_write_50k", "kB/write"),
    ("live_markers_per_item", "markers/item"),
    ("flush_64vb_txn_per_vb_items_per_s", "items/s"),
    ("ack_p99_ms_10k", "ms"),
    ("persist_p50_s_streamed", "s"),
    ("warmup_s", "s"),
    ("disk_mb", "MB"),
    ("quota_rss_peak_growth_mib_4096b", "MiB"),
    ("streamed_over_alone", "x"),
    ("cluster3_consumer_vs_single", "x"),
    ("set_rate_alone", "ops/s"),
    ("received_fraction_10k", "fraction"),
    ("consumer_items_missing", "count"),
    ("set_errors_1conn", "count"),
]


@pytest.mark.parametrize(("metric", "unit"), UNITS, ids=[m for m, _ in UNITS])
def test_a_metric_name_says_its_unit(metric: str, unit: str) -> None:
    assert _report.unit_of(metric) == unit


@pytest.mark.parametrize(
    ("value", "text"),
    [(1234567.8, "1234568"), (98.7654, "98.77"), (0.012345, "0.01235"), (3.0, "3"),
     (float("nan"), "nan")],
)  # fmt: skip
def test_values_are_plain_decimals(value: float, text: str) -> None:
    assert _report.fmt_value(value) == text


def _parse(lines: list[str]) -> dict[str, tuple[float, str]]:
    """The documented format: NAME VALUE UNIT, '#' lines are comments."""
    out = {}
    for line in lines:
        if line.startswith("#"):
            continue
        name, value, unit = line.split(" ")
        out[name] = (float(value), unit)
    return out


def test_every_figure_is_one_line_with_its_ratios_to_the_yardstick_and_the_peer() -> None:
    figures = {"set_ops_per_s_1conn": 200_000.0, "memcached_set_ops_per_s_1conn": 400_000.0,
               "ack_p50_ms_10k": 0.5}  # fmt: skip
    out = _report.Figures("kv", figures, yardstick=(95_000.0, 100_000.0))
    lines = _parse(out.lines())
    assert lines["kv.yardstick_start"] == (95_000.0, "frames/s")
    assert lines["kv.set_ops_per_s_1conn"] == (200_000.0, "ops/s")
    assert lines["kv.set_ops_per_s_1conn/yardstick"] == (2.0, "x")  # over the higher timing
    assert lines["kv.set_ops_per_s_1conn/memcached"] == (0.5, "x")
    assert lines["kv.ack_p50_ms_10k"] == (0.5, "ms")
    assert "kv.ack_p50_ms_10k/yardstick" not in lines  # a latency has no throughput ratio
    paced = _report.Figures("latency", {"achieved_writes_per_s_10k": 9_990.0}, (1.0, 1.0))
    assert paced.ratios == {}  # a paced writer's rate is its pace, not the machine's speed
    assert not any("WARNING" in line for line in out.lines())
    body = out.json(phases={"a": 1})
    assert body["figures"] == figures and body["phases"] == {"a": 1}
    assert body["ratios"]["set_ops_per_s_1conn/memcached"] == 0.5
    assert body["yardstick"] == {"start": 95_000.0, "end": 100_000.0, "unit": "frames/s"}


@pytest.mark.parametrize(("start", "end", "warned"), [(100.0, 119.0, False), (100.0, 121.0, True),
                                                      (121.0, 100.0, True)])  # fmt: skip
def test_a_yardstick_that_moved_over_20_percent_heads_the_block(
    start: float, end: float, warned: bool
) -> None:
    lines = _report.Figures("codec", {"encode_msgs_per_s": 1.0}, (start, end)).lines()
    assert lines[0].startswith("# WARNING") == warned


def test_a_windowed_figure_is_divided_by_its_own_yardstick_and_warns_only_of_its_own() -> None:
    # the benchmark's timings moved 50 %, but the figure's window did not: its ratio holds
    windows = {"set_ops_per_s": [_report.Sample(190_000.0, 200_000.0)]}
    out = _report.Figures("kv", {"set_ops_per_s": 100_000.0, "get_ops_per_s": 50_000.0},
                          (100_000.0, 150_000.0), windows)  # fmt: skip
    assert out.ratios["set_ops_per_s/yardstick"] == 0.5  # over 200k, not the bench's 150k
    assert out.ratios["get_ops_per_s/yardstick"] == 1 / 3  # no window: the bench's timings
    assert out.moved == ["get_ops_per_s"]
    assert out.lines()[0] == ("# WARNING: the yardstick moved over 20% while kv measured "
                              "get_ops_per_s: the machine changed speed, their ratios are "
                              "uncertain")  # fmt: skip
    assert out.figure_yardstick("set_ops_per_s") == 200_000.0
    assert out.json()["windows"] == {"set_ops_per_s": [[190_000.0, 200_000.0, None, None]]}


def test_rounds_give_the_median_figure_and_the_median_of_the_rounds_ratios() -> None:
    # round 2 ran while the machine was slow: its figure is low, and so is its yardstick
    samples = [_report.Sample(100.0, 100.0, 100.0), _report.Sample(50.0, 50.0, 50.0),
               _report.Sample(100.0, 300.0, 400.0)]  # fmt: skip
    windows = {"encode_msgs_per_s": samples}
    out = _report.Figures("codec", {"encode_msgs_per_s": 100.0}, None, windows)
    assert out.ratios["encode_msgs_per_s/yardstick"] == 1.0  # ratios 1, 1, 2
    assert out.moved == []  # one round of three moved: the median holds


def test_windows_and_rounds_time_nothing_outside_a_benchmark_run() -> None:
    calls = iter([{"a_ops_per_s": 3.0}, {"a_ops_per_s": 1.0}, {"a_ops_per_s": 2.0}])
    with _report.window("b_ops_per_s"):
        pass
    assert _report.rounds(3, lambda: next(calls)) == {"a_ops_per_s": 2.0}
    assert _report._windows == {}


def test_a_window_samples_before_and_after_its_block_or_only_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timings = iter([100.0, 200.0, 300.0, 400.0])
    monkeypatch.setattr(_report, "yardstick_rate", lambda rounds=None, bound="cpu": next(timings))
    monkeypatch.setattr(_report, "_held", [])  # as under bench_main
    monkeypatch.setattr(_report, "_windows", {})
    with _report.window("a_ops_per_s", "b_ops_per_s"):
        pass
    with _report.window("c_ops_per_s", after=False):
        pass
    with _report.window():  # no figure: no sample
        pass
    assert _report._windows == {"a_ops_per_s": [_report.Sample(100.0, 200.0)],
                                "b_ops_per_s": [_report.Sample(100.0, 200.0)],
                                "c_ops_per_s": [_report.Sample(300.0, 300.0)]}  # fmt: skip
    assert next(timings) == 400.0


def test_the_yardstick_is_a_positive_rate_and_checks_its_own_round_trip() -> None:
    keys = [b"yardstick-%06d" % i for i in range(1200)]
    buffers = yardstick.encode(keys)
    assert len(buffers) == 3  # BATCH frames to a buffer
    assert yardstick.decode(b"".join(buffers)) == (1200, 1200 * 1201 // 2)
    assert yardstick.one_round(keys) > 0
    rate = subprocess.run([sys.executable, str(BENCH / "yardstick.py"), "--value"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert float(rate) > 0


def test_the_memory_yardstick_chases_one_cycle_through_every_slot() -> None:
    following = yardstick.memory_cycle(1000)
    seen, at = set(), 0
    for _ in range(1000):
        seen.add(at)
        at = following[at]
    assert at == 0 and len(seen) == 1000  # back at the start after visiting each slot once
    assert following != [*range(1, 1000), 0]  # shuffled, not slot after slot
    assert yardstick.memory_cycle(1000) == following  # fixed: the same cycle every time
    assert yardstick.measure_memory(rounds=2, slots=1000, steps=5000) > 0


def test_the_summary_names_the_memory_yardstick_of_the_run(tmp_path: Path) -> None:
    for at, rate in (("start", 2_000_000.0), ("end", 2_500_000.0)):
        body = {"bench": f"memory_yardstick_{at}", "figures": {"memory_steps_per_s": rate}}
        (tmp_path / f"memory_yardstick_{at}.json").write_text(json.dumps(body))
    import compare

    assert compare.memory_yardsticks(tmp_path) == [2_000_000.0, 2_500_000.0]
    header = summary.header(summary.load(tmp_path))
    assert header == ["memory yardstick (bench/yardstick.py --kind memory): 2,000,000 steps/s "
                      "at the start of the run, 2,500,000 at its end"]  # fmt: skip


def _results(tmp_path: Path, run: tuple[float, float], codec: tuple[float, float]) -> Path:
    def write(name: str, body: dict[str, object]) -> None:
        (tmp_path / f"{name}.json").write_text(json.dumps(body))

    write("yardstick_start", {"bench": "yardstick_start", "figures": {"frames_per_s": run[0]}})
    write("yardstick_end", {"bench": "yardstick_end", "figures": {"frames_per_s": run[1]}})
    codec_figures = _report.Figures("codec", {"parse_decode_msgs_per_s": 150_000.0}, codec)
    write("codec", codec_figures.json())
    write("peer_python-floor", {"peer": "python-floor",
                                "median": {"dcp_mutation.decode_full": 300_000.0}})  # fmt: skip
    return tmp_path


def test_the_summary_warns_of_each_moved_yardstick_the_runs_first(tmp_path: Path) -> None:
    run = summary.load(_results(tmp_path, (100_000.0, 150_000.0), (100_000.0, 130_000.0)))
    warnings = summary.warnings(run)
    assert len(warnings) == 2
    assert "during the run" in warnings[0] and "while codec measured parse_decode" in warnings[1]
    calm = summary.load(_results(tmp_path, (100_000.0, 110_000.0), (100_000.0, 101_000.0)))
    assert summary.warnings(calm) == []


def test_the_summary_puts_ratios_first_and_the_yardstick_beside_the_figure(tmp_path: Path) -> None:
    run = summary.load(_results(tmp_path, (100_000.0, 100_000.0), (140_000.0, 150_000.0)))
    row = next(r for r in summary.ROWS if r.figure == ("codec", "parse_decode_msgs_per_s"))
    [line] = summary.row_lines(row, run)
    cells = dict(zip(summary.COLUMNS, line, strict=True))
    assert list(summary.COLUMNS)[:4] == ["metric", "dcpkv / yardstick", "peer", "dcpkv / peer"]
    assert cells["dcpkv / yardstick"] == "1"  # 150k over its own yardstick's 150k, not the run's
    assert cells["dcpkv / peer"] == "0.5"
    assert cells["dcpkv"] == "150,000" and cells["yardstick"] == "150,000 frames/s"


def test_the_readme_section_is_replaced_between_its_markers_only() -> None:
    text = f"intro\n{summary.README_BEGIN}\nold table\n{summary.README_END}\nafter\n"
    new = summary.replace_section(text, "new table\n")
    assert new == f"intro\n{summary.README_BEGIN}\nnew table\n{summary.README_END}\nafter\n"
    with pytest.raises(SystemExit):
        summary.replace_section("no markers", "x")


def test_compare_counts_the_ratios_of_two_runs_that_agree_within_20_percent(
    tmp_path: Path,
) -> None:
    import compare

    for run, (rate, start, end) in {"a": (100.0, 100.0, 100.0), "b": (330.0, 290.0, 300.0)}.items():
        folder = tmp_path / run
        folder.mkdir()
        figures = {"encode_msgs_per_s": rate, "parse_msgs_per_s": 2 * rate if run == "a" else rate}
        body = _report.Figures("codec", figures, (start, end)).json()
        (folder / "codec.json").write_text(json.dumps(body))
    lines, yardsticks, peers, _ = compare.compare(tmp_path / "a", tmp_path / "b")
    assert (yardsticks.agree, yardsticks.total) == (1, 2)  # encode: 1.0 -> 1.1; parse: 2.0 -> 1.1
    assert peers.total == 0
    assert lines[0].startswith("codec.encode_msgs_per_s/yardstick 1 1.100 1.100 100 330")
    assert lines[0].endswith(" AGREE") and lines[1].endswith(" DIFFER")


def test_compare_marks_only_the_figures_whose_own_window_moved(tmp_path: Path) -> None:
    import compare

    for run in ("a", "b"):
        folder = tmp_path / run
        folder.mkdir()
        moved = [_report.Sample(100.0, 150.0)] if run == "b" else [_report.Sample(100.0, 100.0)]
        windows = {"encode_msgs_per_s": moved, "parse_msgs_per_s": [_report.Sample(100.0, 100.0)]}
        figures = {"encode_msgs_per_s": 100.0, "parse_msgs_per_s": 100.0}
        body = _report.Figures("codec", figures, (100.0, 200.0), windows).json()
        (folder / "codec.json").write_text(json.dumps(body))
    lines, _, _, _ = compare.compare(tmp_path / "a", tmp_path / "b")
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["DIFFER*", "AGREE"]


@pytest.fixture
def sampled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """As under bench_main, with a yardstick of 1M frames/s and 20k trips/s: the kinds that
    were sampled, in order."""
    kinds: list[str] = []

    def rate(rounds: int | None = None, bound: str = "cpu") -> float:
        kinds.append(bound)
        return {"cpu": 1_000_000.0, "latency": 20_000.0}[bound]

    monkeypatch.setattr(_report, "yardstick_rate", rate)
    monkeypatch.setattr(_report, "_held", [])
    monkeypatch.setattr(_report, "_windows", {})
    monkeypatch.setattr(_report, "_bounds", {})
    return kinds


def test_a_figure_bound_by_wake_ups_is_divided_by_the_latency_yardstick(
    sampled: list[str],
) -> None:
    kinds = sampled
    with _report.window("set_rate_alone", bound="latency"):
        pass
    got = _report.rounds(1, lambda: {"flush_items_per_s": 500_000.0})
    assert kinds == ["latency", "latency", "cpu", "cpu"]  # each window samples its own bound
    figures = {"set_rate_alone": 10_000.0, "flush_items_per_s": got["flush_items_per_s"]}
    out = _report.Figures("fanout", figures, (1_000_000.0, 1_000_000.0),
                          dict(_report._windows), dict(_report._bounds))  # fmt: skip
    assert out.ratios == {"set_rate_alone/latency_yardstick": 0.5,
                          "flush_items_per_s/yardstick": 0.5}  # fmt: skip
    assert out.json()["bounds"] == {"set_rate_alone": "latency"}
    assert _parse(out.lines())["fanout.set_rate_alone/latency_yardstick"] == (0.5, "x")
    with (
        pytest.raises(ValueError, match="no yardstick for 'disk'"),
        _report.window("x_per_s", bound="disk"),
    ):
        pass


def test_a_rate_a_timer_sets_samples_no_yardstick_and_gets_no_ratio(
    sampled: list[str],
) -> None:
    with _report.window("persist_active_writes_per_s_1", bound=_report.TIMER):
        pass
    assert sampled == []
    out = _report.Figures("durability", {"persist_active_writes_per_s_1": 29.0}, (1e6, 1e6),
                          dict(_report._windows), dict(_report._bounds))  # fmt: skip
    assert out.ratios == {} and out.moved == []
    assert out.json()["bounds"] == {"persist_active_writes_per_s_1": "timer"}


def test_compare_holds_a_rate_a_timer_sets_to_20_percent_itself(tmp_path: Path) -> None:
    import compare

    for run, (timed, cpu) in {"a": (30.0, 100.0), "b": (34.0, 100.0)}.items():
        folder = tmp_path / run
        folder.mkdir()
        figures = {"persist_active_writes_per_s_1": timed, "plain_writes_per_s_256": cpu}
        bounds = {"persist_active_writes_per_s_1": "timer"}
        body = _report.Figures("durability", figures, (100.0, 100.0), bounds=bounds).json()
        (folder / "durability.json").write_text(json.dumps(body))
    lines, yardsticks, _, timers = compare.compare(tmp_path / "a", tmp_path / "b")
    assert (timers.agree, timers.total) == (1, 1)  # 30 -> 34: within 20 %
    assert (yardsticks.agree, yardsticks.total) == (1, 1)  # the cpu-bound one only
    assert "durability.persist_active_writes_per_s_1 30 34 1.133 30 34 AGREE" in lines


def test_a_bound_figure_without_its_own_samples_gets_no_cpu_ratio() -> None:
    # outside bench_main a latency-bound figure has no sample of its yardstick: dividing it by
    # the cpu timings would be the wrong yardstick, so it has no yardstick ratio at all
    out = _report.Figures("fanout", {"set_rate_alone": 10.0}, (100.0, 100.0),
                          bounds={"set_rate_alone": "latency"})  # fmt: skip
    assert out.ratios == {} and out.figure_yardstick("set_rate_alone") is None


def test_the_latency_yardstick_is_a_positive_rate(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH / "yardstick.py"), "--kind", "latency",
                           "--rounds", "1", "--json", str(tmp_path / "y.json")],
                          capture_output=True, text=True, check=True)  # fmt: skip
    name, value, *unit = done.stdout.split()
    assert name == "yardstick.round_trips_per_s" and unit == ["trips/s"]  # no space: one field
    assert float(value) > 0
    body = json.loads((tmp_path / "y.json").read_text())
    assert body["units"] == {"round_trips_per_s": "trips/s"}


def test_the_summary_names_a_bound_figures_yardstick_unit(tmp_path: Path) -> None:
    windows = {"rtt_sets_per_s_alone": [_report.Sample(20_000.0, 20_000.0)]}
    body = _report.Figures("fanout", {"rtt_sets_per_s_alone": 10_000.0}, (1e6, 1e6), windows,
                           {"rtt_sets_per_s_alone": "latency"}).json()  # fmt: skip
    (tmp_path / "fanout.json").write_text(json.dumps(body))
    run = summary.load(tmp_path)
    row = next(r for r in summary.ROWS if r.figure == ("fanout", "rtt_sets_per_s_alone"))
    cells = dict(zip(summary.COLUMNS, summary.row_lines(row, run)[0], strict=True))
    assert cells["dcpkv / yardstick"] == "0.5"
    assert cells["yardstick"] == "20,000 trips/s"


def test_compare_counts_peer_ratios_apart_from_yardstick_ratios(tmp_path: Path) -> None:
    import compare

    assert compare.is_yardstick_ratio("set_rate_alone/latency_yardstick")
    assert not compare.is_yardstick_ratio("set_ops_per_s_1conn/memcached")
    for run, peer in (("a", 100.0), ("b", 200.0)):
        folder = tmp_path / run
        folder.mkdir()
        figures = {"set_ops_per_s_1conn": 100.0, "memcached_set_ops_per_s_1conn": peer}
        body = _report.Figures("kv", figures, (100.0, 100.0)).json()
        (folder / "kv.json").write_text(json.dumps(body))
    _, yardsticks, peers, _ = compare.compare(tmp_path / "a", tmp_path / "b")
    assert (yardsticks.agree, yardsticks.total) == (1, 2)  # memcached's own moved 2x
    assert (peers.agree, peers.total) == (0, 1)


def test_rounds_measured_in_another_process_count_as_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the old commit's script ran three times, each between its own two timings
    monkeypatch.setattr(_report, "_windows", {})
    for value, timing in ((100.0, 100.0), (30.0, 60.0), (90.0, 100.0)):
        _report.record_round({"before_flush_items_per_s": value}, timing, timing)
    out = _report.Figures("engine", {"before_flush_items_per_s": 90.0}, None,
                          dict(_report._windows))  # fmt: skip
    assert out.ratios["before_flush_items_per_s/yardstick"] == 0.9  # ratios 1, 0.5, 0.9


@pytest.mark.parametrize(("last", "met"), [(95.0, "yes"), (85.0, "NO")])
def test_the_set_rate_at_10m_keys_is_held_to_09x_the_rate_at_100k(last: float, met: str) -> None:
    run = summary.Run({"kv_growth": {"first_set_ops_per_s": 100.0, "last_set_ops_per_s": last}},
                      {}, {})  # fmt: skip
    row = next(r for r in summary.ROWS if r.figure == ("kv_growth", "last_set_ops_per_s"))
    cells = dict(zip(summary.COLUMNS, summary.row_lines(row, run)[0], strict=True))
    assert cells["met"] == met


@pytest.mark.parametrize(
    ("ticks", "idle"),
    [
        # (busy, all) ticks of 2 CPUs, one poll apart: 0.1 CPU busy is idle
        ([(0, 0), (1, 20)], True),
        # a CPU busy (what a benchmark left running), then idle
        ([(0, 0), (10, 20), (11, 40)], True),
        # a CPU busy to the end: the timing goes ahead, and says so
        ([(10 * i, 20 * i) for i in range(10_000)], False),
    ],
)
def test_a_timing_waits_for_the_machine_to_go_idle(
    monkeypatch: pytest.MonkeyPatch, ticks: list[tuple[int, int]], idle: bool
) -> None:
    polls = iter(ticks)
    monkeypatch.setattr(_report, "_busy_and_total", lambda: next(polls))
    monkeypatch.setattr(_report, "SETTLE_POLL_S", 0.001)
    monkeypatch.setattr(_report.os, "cpu_count", lambda: 2)
    assert _report.settle(0.02) is idle


def test_the_machine_s_ticks_are_read_from_proc_stat() -> None:
    ticks = _report._busy_and_total()
    if not Path("/proc/stat").exists():
        assert ticks is None
        return
    assert ticks is not None
    busy, total = ticks
    assert 0 < busy < total


def test_the_yardstick_warms_up_before_it_times(monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[int] = []
    monkeypatch.setattr(yardstick, "one_round", lambda keys: timed.append(len(keys)) or 0.001)
    monkeypatch.setattr(yardstick, "WARMUP_S", 0.01)
    assert yardstick.measure(frames=10, rounds=3) == 10_000.0
    assert len(timed) > 3  # untimed rounds first, then the 3 timed


# (monotonic seconds, frames/s): bursts of the probe, 0.1 s apart
READINGS = [(10.0 + i / 10, speed) for i, speed in enumerate(
    [800.0, 1000.0, 900.0, 950.0, 700.0,      # 10.0-10.4: fastest 1000
     500.0, 600.0, 550.0, 500.0, 400.0,       # 10.5-10.9: fastest 600
     1200.0, 1100.0, 1150.0, 1000.0, 1100.0]  # 11.0-11.4: fastest 1200
)]  # fmt: skip


@pytest.mark.parametrize(
    ("start", "end", "speed"),
    [
        (10.0, 11.45, (1000 + 600 + 1200) / 3),  # each half second's fastest burst, averaged
        (10.0, 10.45, 1000.0),  # one half second
        (10.2, 10.3, 1000.0),  # shorter than a bin: the half second around its middle
        (10.6, 10.65, 700.0),  # (the half second 10.375-10.875: the bursts 10.4-10.8)
        (20.0, 21.0, None),  # no burst fell in it
    ],
)
def test_the_probe_s_speed_over_a_span_is_its_bins_fastest_bursts_averaged(
    start: float, end: float, speed: float | None
) -> None:
    got = _report.probe_speed(READINGS, start, end)
    assert got == (None if speed is None else pytest.approx(speed))


def test_a_probed_window_is_divided_by_the_probe_s_speed_of_its_bound_a_latency_one_is_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    span = (10.0, 10.45)  # the probe: 1000 frames/s, 250 steps/s; the samples around: 2000
    monkeypatch.setattr(_report, "_windows", {
        "set_ops_per_s": [_report.Sample(2000.0, 2000.0, span=span)],
        "rtt_ops_per_s": [_report.Sample(2000.0, 2000.0, span=span)],
        "far_ops_per_s": [_report.Sample(2000.0, 2000.0, span=(50.0, 51.0))],
        "hash_ops_per_s": [_report.Sample(2000.0, 2000.0, span=span)],
    })  # fmt: skip
    monkeypatch.setattr(_report, "_bounds", {"rtt_ops_per_s": "latency",
                                             "hash_ops_per_s": _report.MEMORY})  # fmt: skip
    figures = {"set_ops_per_s": 500.0, "rtt_ops_per_s": 500.0, "far_ops_per_s": 500.0,
               "get_ops_per_s": 600.0, "hash_ops_per_s": 500.0}  # fmt: skip
    held = _report._Held(tmp_path / "kv.json", "kv", figures, {})
    memory = [(at, speed / 4) for at, speed in READINGS]
    _report._emit(held, (3000.0, 3000.0), {"cpu": READINGS, "memory": memory}, (10.0, 11.45))
    body = json.loads((tmp_path / "kv.json").read_text())
    assert body["ratios"]["set_ops_per_s/yardstick"] == 0.5  # over the probe's 1000
    assert body["ratios"]["hash_ops_per_s/memory_yardstick"] == 2.0  # the memory bursts' 250
    assert body["ratios"]["rtt_ops_per_s/latency_yardstick"] == 0.25  # its samples' 2000
    assert body["ratios"]["far_ops_per_s/yardstick"] == 0.25  # no burst in its span: samples
    assert body["ratios"]["get_ops_per_s/yardstick"] == pytest.approx(600 / (2800 / 3))
    assert body["windows"]["set_ops_per_s"] == [[2000.0, 2000.0, None, 1000.0]]
    assert body["yardstick"]["during"] == pytest.approx(2800 / 3)
    assert "kv.set_ops_per_s/yardstick 0.5000 x" in capsys.readouterr().out


def test_the_probe_s_log_skips_a_line_being_written(tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    log.write_text("10.0000 1100000 2000000 1\n10.1000 1200000 2100000\n10.2000 1300000 21")
    assert _report.read_probe(log) == {
        "cpu": [(10.0, 1_100_000.0), (10.1, 1_200_000.0)],
        "memory": [(10.0, 2_000_000.0), (10.1, 2_100_000.0)],
    }


def test_the_probe_s_bursts_on_a_mostly_idle_cpu_do_not_count(tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    log.write_text("10.0000 1100000 2000000 1 0.90\n"
                   "10.1000 700000 1500000 0 0.10\n"  # a wake-up: left out
                   "10.2000 1200000 2100000 1 0.50\n")  # fmt: skip
    assert _report.read_probe(log) == {
        "cpu": [(10.0, 1_100_000.0), (10.2, 1_200_000.0)],
        "memory": [(10.0, 2_000_000.0), (10.2, 2_100_000.0)],
    }


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        ({0: (110, 1100), 1: (190, 1100)}, (1, 0.9)),  # cpu 1 did 90 of 100 ticks
        ({0: (150, 1100), 1: (110, 1100)}, (0, 0.5)),
        ({0: (100, 1000), 1: (100, 1000)}, (0, 0.0)),  # no time passed: nothing counted
    ],
)
def test_the_probe_picks_the_busiest_cpu_and_says_how_busy_it_was(
    now: dict[int, tuple[int, int]], expected: tuple[int, float]
) -> None:
    last = {0: (100, 1000), 1: (100, 1000)}
    assert yardstick._busiest(last, now, {0, 1}) == expected


def test_the_probe_times_bursts_until_its_parent_exits(tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    parent = (f"import subprocess, sys, time\n"
              f"probe = subprocess.Popen([sys.executable, {str(BENCH / 'yardstick.py')!r}, "
              f"'--probe', {str(log)!r}, '--slots', '1000'])\n"
              f"print(probe.pid, flush=True)\n"
              f"time.sleep(2.0)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True,
                          check=True)  # fmt: skip
    pid = int(done.stdout)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # (an orphan is reaped by init once it exits)
    assert not Path(f"/proc/{pid}").exists(), "the probe outlived its parent"
    lines = [line.split() for line in log.read_text().splitlines()]
    assert lines and all(len(fields) == 5 and 0 <= float(fields[4]) <= 1 for fields in lines)
    everything = tmp_path / "everything.log"  # the same bursts, each as if on a busy CPU
    everything.write_text("".join(" ".join([*f[:4], "1.00"]) + "\n" for f in lines))
    readings = _report.read_probe(everything)
    assert len(readings["cpu"]) == len(lines) == len(readings["memory"])
    for bursts in readings.values():
        assert all(speed > 0 for _, speed in bursts)
        assert [at for at, _ in bursts] == sorted(at for at, _ in bursts)


def test_bench_main_waits_for_the_probe_s_first_bursts_and_not_forever(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "probe.log"
    log.write_text("")
    started = time.monotonic()
    _report._await_probe(log, limit=0.3)  # a probe that never times anything
    assert time.monotonic() - started >= 0.3
    assert "the probe timed nothing" in capsys.readouterr().err
    log.write_text("10.0000 700000 1500000 0 0.05\n")
    _report._await_probe(log, limit=0.0)  # one burst in (on an idle CPU): no wait, no message
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("during", "speed"), [(900.0, 900.0), (None, 1200.0)])
def test_a_figure_without_a_window_goes_with_the_probe_over_its_benchmark_else_the_timings(
    during: float | None, speed: float
) -> None:
    out = _report.Figures("kv", {"get_ops_per_s": 600.0}, (1000.0, 1200.0), during=during)
    assert out.figure_yardstick("get_ops_per_s") == speed
    assert out.ratios["get_ops_per_s/yardstick"] == 600.0 / speed


def test_a_benchmark_run_keeps_its_probe_s_bursts_beside_its_json(tmp_path: Path) -> None:
    script = tmp_path / "tiny.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "from pathlib import Path\n"
        "from _report import bench_main, window, write_json\n"
        "def main(json: Path) -> None:\n"
        "    with window('loop_ops_per_s'):\n"
        "        start = time.perf_counter()\n"
        "        while time.perf_counter() - start < 0.6:\n"
        "            pass\n"
        "    write_json(json, 'tiny', {'loop_ops_per_s': 1000.0})\n"
        "bench_main(main)\n"
    )  # fmt: skip
    out = tmp_path / "results" / "tiny.json"
    subprocess.run([sys.executable, str(script), str(out)], check=True,
                   capture_output=True, text=True)  # fmt: skip
    body = json.loads(out.read_text())
    assert body["ratios"]["loop_ops_per_s/yardstick"] > 0
    bursts = _report.read_probe(out.with_suffix(".probe.log"))
    assert bursts["cpu"] and len(bursts["memory"]) == len(bursts["cpu"])
