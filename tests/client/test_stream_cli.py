"""``dcpkv stream`` and ``dcpkv failover-log`` as subprocesses against a real server."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dcpkv.cli import stream as cli_stream
from dcpkv.cli.stream import LineWriter, Saver, event_record, format_line, line_of, parse_vbuckets
from dcpkv.client import events
from dcpkv.client.offsets import Offsets, VbucketOffset
from support.clienthelp import VBUCKETS, Writer
from support.serverproc import ServerProcess

ITEMS = 3000


def dcpkv(*args: str) -> list[str]:
    return [sys.executable, "-m", "dcpkv.cli.main", *args]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dcpkv(*args), capture_output=True, text=True, timeout=120)


def test_parse_vbuckets() -> None:
    assert parse_vbuckets("0,1,5-9") == [0, 1, 5, 6, 7, 8, 9]
    assert parse_vbuckets(None) is None
    for bad in ("x", "3-1", "1-"):
        with pytest.raises(ValueError):
            parse_vbuckets(bad)


def test_json_lines_keep_every_field_exactly() -> None:
    offset = VbucketOffset.at(7, 1)
    cases = [
        events.Mutation(3, b"k\xc3\xa9", b'{"a":1}', 7, 2, 0xFFFFFFFF, 5, 2**64 - 1, 1, offset),
        events.Mutation(3, b"\xff\xfe", b"\x00\x01", 7, 2, 0, 0, 1, 0, offset),
        events.Deletion(4, b"gone", 8, 3, 2**63, offset, 99),
        events.Rollback(5, 10, 12, offset, offset),
    ]
    for ev in cases:
        rec = event_record(ev)
        assert rec is not None
        assert json.loads(format_line(rec, "json")) == rec  # the stdlib reads it back as is


def test_line_of_is_the_record_formatted() -> None:
    """The fast line of a UTF-8 mutation is byte for byte the general path's line."""
    offset = VbucketOffset.at(7, 1)
    cases = [
        events.Mutation(
            3, b"k\xc3\xa9", b'{"a":"\\u00e9"}', 7, 2, 0xFFFFFFFF, 5, 2**64 - 1, 1, offset
        ),
        events.Mutation(3, b"key", b"\xff\x00", 7, 2, 0, 0, 1, 0, offset),  # value in base64
        events.Mutation(3, b"\xff", b"v", 7, 2, 0, 0, 1, 0, offset),  # key in base64
        events.Deletion(4, b"gone", 8, 3, 2**63, offset, 99),
        events.Expiration(4, b"old", 9, 3, 5, offset, 1),
        events.Rollback(5, 10, 12, offset, offset),
        events.SnapshotStart(5, 1, 4, 1, offset),  # not printed
    ]
    for fmt in ("json", "table"):
        for ev in cases:
            rec = event_record(ev)
            assert line_of(ev, fmt) == (None if rec is None else format_line(rec, fmt))


def test_saver_saves_when_a_list_crosses_the_event_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_stream, "SAVE_EVERY_EVENTS", 100)
    monkeypatch.setattr(cli_stream, "SAVE_EVERY_S", 1e9)  # only the event count here
    out = LineWriter(io.BytesIO())
    saves: list[int] = []
    saver = Saver(tmp_path / "offsets.json", Offsets, out)
    monkeypatch.setattr(saver, "save", lambda: saves.append(saver.events))
    for n in (60, 30, 40, 256, 1):  # 60, 90, 130 (crosses 100), 386 (crosses 200, 300), 387
        saver.tick(n)
    assert saves == [130, 386]


def test_line_writer_writes_blocks_and_whenever_the_task_waits() -> None:
    async def main() -> list[bytes]:
        out = io.BytesIO()
        task = asyncio.current_task()
        assert task is not None
        lines = LineWriter(out, task, block=100)
        seen = []
        for i in range(3):
            lines.write_line(b"line%d" % i)
        seen.append(out.getvalue())  # nothing yet: the task has not waited
        await asyncio.sleep(0)  # waits: the lines go out
        seen.append(out.getvalue())
        for _ in range(12):
            lines.write_line(b"x" * 9)  # 10 bytes each: a block of 100 written at once
        seen.append(out.getvalue())
        lines.flush()
        seen.append(out.getvalue())
        return seen

    empty, three, block, everything = asyncio.run(main())
    assert empty == b""
    assert three == b"line0\nline1\nline2\n"
    assert block == three + b"xxxxxxxxx\n" * 10
    assert everything == three + b"xxxxxxxxx\n" * 12


def test_stream_counts_resume_and_failover_log(server: ServerProcess, tmp_path: Path) -> None:
    port = str(server.port)
    w = Writer(server.port)
    for i in range(ITEMS):
        w.set(b"item%05d" % i, b"\xff\x00" if i == 7 else b"value-%d" % i)
    offsets = tmp_path / "offsets.json"
    done = run("stream", "--port", port, "--to", "now", "--save-offsets", str(offsets))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    curr_items = int(w.c.stats(b"")["curr_items"])
    assert len(lines) == curr_items == ITEMS
    assert {rec["op"] for rec in lines} == {"mutation"}
    binary = next(rec for rec in lines if rec["key"] == "item00007")
    assert binary["value_base64"] is True and binary["value"] == "/wA="
    assert set(Offsets.load(offsets)) == set(range(VBUCKETS))
    # resume: only what changed since
    w.set(b"item00001", b"changed")
    w.delete(b"item00002")
    again = run("stream", "--port", port, "--from", str(offsets), "--to", "now",
                "--save-offsets", str(offsets))  # fmt: skip
    assert again.returncode == 0, again.stderr
    recs = [json.loads(line) for line in again.stdout.splitlines()]
    assert sorted((r["op"], r["key"], r["value"]) for r in recs) == [
        ("deletion", "item00002", None),
        ("mutation", "item00001", "changed"),
    ]
    subset = run("stream", "--port", port, "--vbuckets", "0,2-3", "--to", "now",
                 "--format", "table")  # fmt: skip
    assert subset.returncode == 0, subset.stderr
    assert {int(line.split()[1]) for line in subset.stdout.splitlines()} == {0, 2, 3}
    flog = run("failover-log", "0", "5", "--port", port, "--json")
    assert flog.returncode == 0, flog.stderr
    doc = json.loads(flog.stdout)
    assert set(doc) == {"0", "5"} and doc["0"][0]["seqno"] == 0
    table = run("failover-log", "3", "--port", port)
    assert table.returncode == 0 and "uuid" in table.stdout
    w.close()


def test_ctrl_c_saves_offsets_and_exits_zero(server: ServerProcess, tmp_path: Path) -> None:
    w = Writer(server.port)
    for i in range(200):
        w.set(b"c%d" % i, b"x")
    offsets = tmp_path / "offsets.json"
    proc = subprocess.Popen(
        dcpkv("stream", "--port", str(server.port), "--save-offsets", str(offsets)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for _ in range(200):  # every existing item, then the stream waits for more
            assert proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    saved = Offsets.load(offsets)
    assert sum(saved[vb].seqno for vb in saved) == 200
    w.close()
