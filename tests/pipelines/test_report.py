"""The metrics report: a PNG from synthetic ``_metrics.jsonl`` files, and its CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dcpkv.cli.main import app
from dcpkv.pipelines.report import ReportError, draw_report, read_series

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_metrics(directory: Path, batches: int, first_rows: int = 20_000) -> None:
    directory.mkdir(parents=True)
    lines = []
    for i in range(batches):
        batch = {
            "batch_id": i, "finished_at": 1_700_000_000.0 + 2 * i,
            "rows": first_rows if i == 0 else 100 + i, "rollbacks": 0, "seconds": 0.5,
            "lag": None if i == 2 else 1000 - 10 * i,
        }  # fmt: skip
        if i != 3:  # older lines have no lag_s, a view's is null
            batch["lag_s"] = None if i == 1 else 0.25 * i
        lines.append(json.dumps(batch))
    # A running pipeline may be halfway through its next line.
    (directory / "_metrics.jsonl").write_text("\n".join(lines) + '\n{"batch_id": 9')


def test_series_reads_batches_and_skips_a_partial_line(tmp_path: Path) -> None:
    write_metrics(tmp_path / "mirror", 5)
    series = read_series(tmp_path / "mirror")
    assert series.label == "mirror"
    assert series.rows == [20_000, 101, 102, 103, 104]
    assert series.rates[1] == pytest.approx(202.0)
    assert series.lag[2] is None and series.lag[3] == 970
    assert series.lag_s == [0.0, None, 0.5, None, 1.0]
    assert series.started[0] == pytest.approx(1_700_000_000.0 - 0.5)


def test_draw_report_writes_a_png(tmp_path: Path) -> None:
    write_metrics(tmp_path / "mirror", 12)
    write_metrics(tmp_path / "view", 12, first_rows=150)  # a linear scale this time
    out = draw_report([tmp_path / "mirror", tmp_path / "view"], tmp_path / "out" / "r.png")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_marks_are_drawn_as_vertical_lines_on_every_panel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.axes

    write_metrics(tmp_path / "mirror", 5)
    drawn: list[float] = []
    original = matplotlib.axes.Axes.axvline

    def spy(self: matplotlib.axes.Axes, x: float = 0, *args: object, **kw: object) -> object:
        drawn.append(x)
        return original(self, x, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "axvline", spy)
    marks = [(1_700_000_003.0, "failover 127.0.0.1:1"), (1_700_000_006.5, "failover 127.0.0.1:2")]
    out = draw_report([tmp_path / "mirror"], tmp_path / "r.png", marks=marks)
    assert out.read_bytes()[:8] == PNG_MAGIC
    # seconds since the first batch started (1_700_000_000 - 0.5), once per panel
    assert sorted(drawn) == pytest.approx([3.5] * 4 + [7.0] * 4)  # four panels


def test_missing_or_empty_metrics_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"no _metrics\.jsonl"):
        read_series(tmp_path)
    (tmp_path / "_metrics.jsonl").write_text("")
    with pytest.raises(ReportError, match="no batch"):
        read_series(tmp_path)


def test_cli_report_defaults_to_the_first_dir(tmp_path: Path) -> None:
    write_metrics(tmp_path / "mirror", 3)
    result = CliRunner().invoke(app, ["pipeline", "report", str(tmp_path / "mirror")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "mirror" / "report.png").read_bytes()[:8] == PNG_MAGIC
    result = CliRunner().invoke(app, ["pipeline", "report", str(tmp_path / "nothing")])
    assert result.exit_code == 1
