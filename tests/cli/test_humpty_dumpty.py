"""`humpty-dumpty` as a user runs it: the installed script, stdin in, stdout/stderr out."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from dcpkv.cli.humpty_dumpty import run_spec_example

BIN = Path(sys.executable).parent
SPEC_TABLE = '[{"id":2222,"seq":3},{"id":1111,"seq":0}]'
HEADER = """Simulating behaviour of VBucket with highSeqno: 10, purgeSeqno:0, failoverTable:
[
    {"id":2222,"seq":3}
    {"id":1111,"seq":0}
]

"""


def humpty(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "humpty-dumpty"), *args], input=stdin, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def failover_json(tmp_path: Path) -> Path:
    path = tmp_path / "failover.json"
    path.write_text(SPEC_TABLE)
    return path


def test_spec_example_correct_resume(failover_json: Path) -> None:
    run = humpty(str(failover_json), "10", "0", stdin="1111 1 4 3\n")
    assert run.returncode == 0
    assert run.stdout == HEADER + (
        "Testing UUID:1111 snapshot:{1,4} start:3\n"
        "  Rollback:true\n"
        "  Requested rollback seqno:1\n"
        "  Reason: consumer ahead of producer - producer upper at 3\n"
    )


def test_spec_example_incorrect_resume(failover_json: Path) -> None:
    run = humpty(str(failover_json), "10", "0", stdin="1111 3 3 3\n")
    assert run.returncode == 0
    assert run.stdout == HEADER + "Testing UUID:1111 snapshot:{3,3} start:3\n  Rollback:false\n"


def test_header_shows_the_sanitised_table(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text('[{"id":0,"seq":9},{"id":5,"seq":4},{"id":6,"seq":8},{"id":7,"seq":1}]')
    run = humpty(str(path), "10", "0")
    assert '{"id":5,"seq":4}\n    {"id":7,"seq":1}\n]' in run.stdout
    assert '"id":0' not in run.stdout and '"id":6' not in run.stdout


def test_bad_lines_are_warned_about_and_skipped(failover_json: Path) -> None:
    run = humpty(str(failover_json), "10", "0", stdin="1111 1 4\nabc 1 2 3\n\n1111 3 3 3\n")
    assert run.returncode == 0
    assert run.stdout.count("Testing UUID") == 1
    assert "line 1" in run.stderr and "line 2" in run.stderr
    assert "Traceback" not in run.stderr


def test_64_bit_values_round_trip_exactly(tmp_path: Path) -> None:
    top = 2**64 - 1
    path = tmp_path / "f.json"
    path.write_text(f'[{{"id":{top},"seq":{top - 5}}}]')
    run = humpty(str(path), str(top), "0", stdin=f"{top} {top - 3} {top} {top}\n")
    assert f'{{"id":{top},"seq":{top - 5}}}' in run.stdout
    assert f"Testing UUID:{top} snapshot:{{{top - 3},{top}}} start:{top}\n  Rollback:false" in (
        run.stdout
    )
    run = humpty(str(path), str(top), "0", stdin=f"{top + 1} 0 0 0\n")
    assert "larger than 2^64-1" in run.stderr


@pytest.mark.parametrize(
    "args", [(), ("only-one",), ("f.json", "10"), ("f.json", "ten", "0"), ("f.json", "10", "-1")]
)
def test_wrong_arguments_print_usage_and_fail(args: tuple[str, ...]) -> None:
    run = humpty(*args)
    assert run.returncode != 0
    assert "Usage: humpty-dumpty" in run.stdout + run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [("{", "not valid JSON"), ('{"id":1}', "JSON array"), ('[{"id":1}]', "entry 0")],
)
def test_malformed_json_is_a_one_line_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "f.json"
    path.write_text(content)
    run = humpty(str(path), "10", "0")
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and message in run.stderr
    assert run.stderr.startswith("humpty-dumpty: error:")


def test_unreadable_file_is_a_one_line_error(tmp_path: Path) -> None:
    run = humpty(str(tmp_path / "missing.json"), "10", "0")
    assert run.returncode == 1
    assert run.stderr == f"humpty-dumpty: error: cannot read {tmp_path / 'missing.json'}: " + (
        "No such file or directory\n"
    )


def test_the_spec_example_runs() -> None:
    # Formerly `dcpkv demo`; the main job is now the pipelines demo (tests/spark/test_demo.py).
    out = io.StringIO()
    assert run_spec_example(out) == 0
    assert "Requested rollback seqno:1" in out.getvalue()
    assert out.getvalue().count("Rollback:false") == 1


@pytest.mark.parametrize("cmd", [("dcpkv", "--help"), ("humpty-dumpty", "--help")])
def test_help_explains(cmd: tuple[str, ...]) -> None:
    run = subprocess.run([str(BIN / cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0
    assert "Usage" in run.stdout
