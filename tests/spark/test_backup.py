"""Incremental backup and restore against real servers, with an unclean restart between runs.

One scenario (module scope: Spark jobs and servers are the slow part) builds a backup of
three runs, then the tests look at it:

* run 1: sample documents, persisted by a clean restart;
* run 2 (the CLI, as a subprocess): updates, deletes and new keys, never persisted, all in
  vbuckets 1-7 (vbucket 0 stays untouched);
* kill -9 loses run 2's writes; the server restarts on new branches; more writes;
* run 3 must record "vbucket v rolled back to <run 1's end>" for every vbucket run 2 touched,
  and vbucket 0 (new branch, nothing lost) must resume without a rollback;
* run 4: nothing changed, an empty run that still joins the chain.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from sparkhelp import NO_FLUSH, server_docs, vb

from dcpkv.client.settings import ConnectionSettings
from dcpkv.core.status import Status
from dcpkv.pipelines import sample_data
from dcpkv.pipelines.backup import (
    BackupError,
    cut_points,
    parse_to_seqnos,
    restore,
    run_backup,
)
from dcpkv.pipelines.backup_layout import committed_runs, verify
from dcpkv.protocol.constants import Opcode
from support.kvclient import KVClient
from support.serverproc import ServerProcess

CLI = [sys.executable, "-m", "dcpkv.cli.main"]


@dataclass
class Scenario:
    root: Path
    base: Path
    keys: set[bytes] = field(default_factory=set)
    b_keys: set[bytes] = field(default_factory=set)
    truth: dict[int, dict[bytes, bytes]] = field(default_factory=dict)  # after run n
    servers: list[ServerProcess] = field(default_factory=list)
    cli_list: str = ""

    def fresh_server(self, name: str) -> ServerProcess:
        srv = ServerProcess(self.base / name, self.base / f"{name}.log", "--vbuckets", "8")
        self.servers.append(srv)
        srv.start()
        return srv


def _write(port: int, docs: dict[bytes, bytes | None]) -> None:
    with KVClient(port) as kv:
        assert kv.login().status == Status.Success
        for key, value in docs.items():
            if value is None:
                assert kv.call(Opcode.Delete, key=key, vbucket=vb(key)).status == Status.Success
            else:
                assert kv.set(key, value, vbucket=vb(key)).status == Status.Success


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=240)


def _b_changes(existing: list[bytes]) -> dict[bytes, bytes | None]:
    """15 updates, 10 deletes, 20 new keys: 45 changes, one per key, none in vbucket 0."""
    outside_vb0 = [k for k in existing if vb(k) != 0]
    new = [k for k in (b"new-%03d" % i for i in range(100)) if vb(k) != 0][:20]
    out: dict[bytes, bytes | None] = {k: b'{"v":"updated"}' for k in outside_vb0[:15]}
    out.update(dict.fromkeys(outside_vb0[15:25]))
    out.update({k: b'{"v":"new"}' for k in new})
    return out


@pytest.fixture(scope="module")
def scenario(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    base = tmp_path_factory.mktemp("backup")
    sc = Scenario(root=base / "backup", base=base)
    src = ServerProcess(base / "src", base / "src.log", *NO_FLUSH)
    sc.servers.append(src)
    try:
        _build(spark, sc, src)
        yield sc
    finally:
        for srv in sc.servers:
            srv.reap()


def _build(spark: Any, sc: Scenario, src: ServerProcess) -> None:
    src.start()
    docs = dict(sample_data.documents(60, seed=3))
    _write(src.port, dict(docs))
    sc.keys |= set(docs)
    src.terminate()  # a clean stop persists run 1's data...
    src.start()
    run_backup(spark, sc.root, ConnectionSettings.at(port=src.port))
    sc.truth[1] = server_docs(src.port, sc.keys)

    b = _b_changes(sorted(docs))
    sc.b_keys = set(b)
    _write(src.port, b)  # ...run 2's is never persisted
    sc.keys |= set(b)
    done = _cli("backup", "--to", str(sc.root), "--port", str(src.port), "--master", "local[2]")
    assert done.returncode == 0, done.stderr
    assert "run 000002: 45 change(s)" in done.stdout
    sc.truth[2] = server_docs(src.port, sc.keys)

    src.kill9()  # run 2's writes are lost: vbuckets 1-7 branch below what run 2 read
    src.start()
    c = {k: b'{"v":"after-crash"}' for k in sorted(docs)[:10] + [b"late-%d" % i for i in range(8)]}
    c = {k: v for k, v in c.items() if vb(k) != 0}
    _write(src.port, dict(c))
    sc.keys |= set(c)
    run_backup(spark, sc.root, ConnectionSettings.at(port=src.port))
    sc.truth[3] = server_docs(src.port, sc.keys)
    run_backup(spark, sc.root, ConnectionSettings.at(port=src.port))
    listed = _cli("backup", "list", "--from", str(sc.root))
    assert listed.returncode == 0, listed.stderr
    sc.cli_list = listed.stdout


def _keys_of(run_data: Path) -> list[tuple[str, bytes]]:
    table = pq.read_table(run_data, columns=["op", "key"])
    return list(zip(table["op"].to_pylist(), table["key"].to_pylist(), strict=True))


# -- what the runs hold ---------------------------------------------------------------------


def test_run_2_holds_only_the_changes_since_run_1(scenario: Scenario) -> None:
    runs = committed_runs(scenario.root)
    assert [r.number for r in runs] == [1, 2, 3, 4]
    t1, t2 = runs[0].manifest["totals"], runs[1].manifest["totals"]
    assert t1["changes"] == t1["mutations"] == 60
    assert (t2["changes"], t2["mutations"], t2["deletions"]) == (45, 35, 10)
    assert runs[1].manifest["rollbacks"] == []
    rows = _keys_of(runs[1].data)
    assert sorted(k for _op, k in rows) == sorted(scenario.b_keys)
    assert sum(op == "deletion" for op, _k in rows) == 10
    assert runs[1].manifest["start"] == runs[0].manifest["end"]


def test_run_3_records_the_rollback_of_what_run_2_read(scenario: Scenario) -> None:
    run1, run2, run3, _run4 = committed_runs(scenario.root)
    touched = {vb(k) for k in scenario.b_keys}
    assert 0 not in touched
    expected = {(v, run1.end[v].offset.seqno) for v in touched}
    recorded = {(r["vbucket"], r["seqno"]) for r in run3.manifest["rollbacks"]}
    assert recorded == expected
    assert all(r["message"] == f"vbucket {r['vbucket']} rolled back to {r['seqno']}"
               for r in run3.manifest["rollbacks"])  # fmt: skip
    rows = pq.read_table(run3.data, columns=["op", "vbucket", "seqno"]).to_pylist()
    assert {(r["vbucket"], int(r["seqno"])) for r in rows if r["op"] == "rollback"} == expected
    # vbucket 0: a new branch, but nothing of it was lost, so no rollback and no change
    assert run3.vb(0)["rollbacks"] == [] and run3.vb(0)["max_seqno"] == 0
    assert run3.manifest["start"] == run2.manifest["end"]


def test_list_shows_every_run_with_its_rollbacks(scenario: Scenario) -> None:
    out = scenario.cli_list
    for name in ("000001", "000002", "000003", "000004"):
        assert name in out
    run3 = committed_runs(scenario.root)[2]
    for r in run3.manifest["rollbacks"]:
        assert f"vb {r['vbucket']} -> {r['seqno']}" in out


# -- verify ---------------------------------------------------------------------------------


def test_verify_passes_on_the_backup(scenario: Scenario) -> None:
    assert verify(scenario.root) == []
    done = _cli("backup", "verify", "--from", str(scenario.root))
    assert done.returncode == 0, done.stderr
    assert "4 run(s), chain contiguous" in done.stdout


def _copy(scenario: Scenario, tmp_path: Path) -> Path:
    return Path(shutil.copytree(scenario.root, tmp_path / "copy"))


def test_verify_fails_on_a_corrupted_file(scenario: Scenario, tmp_path: Path) -> None:
    root = _copy(scenario, tmp_path)
    part = sorted((root / "runs" / "000002" / "data").glob("*.parquet"))[0]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    done = _cli("backup", "verify", "--from", str(root))
    assert done.returncode == 1
    assert f"run 000002: checksum mismatch in data/{part.name}" in done.stderr


def test_verify_reports_a_missing_run_as_a_gap(scenario: Scenario, tmp_path: Path) -> None:
    root = _copy(scenario, tmp_path)
    shutil.rmtree(root / "runs" / "000002")
    problems = verify(root)
    assert any(p.startswith("gap: run 000002 is missing") for p in problems)
    assert any(p.startswith("gap: vbucket 1: run 000003 starts at") for p in problems)


def test_verify_notices_an_unrecorded_rollback(scenario: Scenario, tmp_path: Path) -> None:
    root = _copy(scenario, tmp_path)
    manifest_path = root / "runs" / "000003" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    victim = manifest["rollbacks"][0]["vbucket"]
    manifest["vbuckets"][str(victim)]["rollbacks"] = []
    manifest_path.write_text(json.dumps(manifest))
    problems = verify(root)
    assert any(f"vbucket {victim}: run 000003 started on an abandoned branch" in p
               for p in problems)  # fmt: skip


def test_what_a_crashed_run_left_is_ignored(scenario: Scenario, tmp_path: Path) -> None:
    root = _copy(scenario, tmp_path)
    (root / "runs" / ".tmp-000005-1").mkdir()
    (root / "runs" / ".tmp-000005-1" / "junk.parquet").write_bytes(b"half a file")
    (root / "runs" / "000005").mkdir()  # renamed but no manifest: cannot come from a commit
    assert verify(root) == []
    assert [r.number for r in committed_runs(root)] == [1, 2, 3, 4]
    done = _cli("backup", "list", "--from", str(root))
    assert "ignored (incomplete, from a crashed run): .tmp-000005-1" in done.stdout


# -- restore --------------------------------------------------------------------------------


def test_restore_into_a_fresh_server_equals_the_source(spark: Any, scenario: Scenario) -> None:
    target = scenario.fresh_server("full")
    result = restore(spark, scenario.root, ConnectionSettings.at(port=target.port))
    assert result.runs == 4 and result.rollbacks_applied == len(
        committed_runs(scenario.root)[2].manifest["rollbacks"]
    )
    restored = server_docs(target.port, scenario.keys)
    assert restored == scenario.truth[3]
    # the lost run-2 writes did not come back
    lost_only = scenario.b_keys - set(scenario.truth[3])
    assert lost_only and not lost_only & set(restored)


def test_point_in_time_restore_to_run_1(spark: Any, scenario: Scenario) -> None:
    run1 = committed_runs(scenario.root)[0]
    seqnos = {str(v): pos.offset.seqno for v, pos in run1.end.items()}
    target = scenario.fresh_server("pit1")
    restore(
        spark,
        scenario.root,
        ConnectionSettings.at(port=target.port),
        parse_to_seqnos(json.dumps(seqnos)),
    )
    assert server_docs(target.port, scenario.keys) == scenario.truth[1]


def test_point_in_time_restore_of_a_state_the_server_lost(spark: Any, scenario: Scenario) -> None:
    # run 2's manifest as the FILE form: the state after run 2, which the crash destroyed
    manifest = committed_runs(scenario.root)[1].path / "manifest.json"
    target = scenario.fresh_server("pit2")
    restore(
        spark,
        scenario.root,
        ConnectionSettings.at(port=target.port),
        parse_to_seqnos(str(manifest)),
    )
    assert server_docs(target.port, scenario.keys) == scenario.truth[2]


def test_restore_refuses_a_backup_that_does_not_verify(
    spark: Any, scenario: Scenario, tmp_path: Path
) -> None:
    root = _copy(scenario, tmp_path)
    shutil.rmtree(root / "runs" / "000001")
    with pytest.raises(BackupError, match="does not verify"):
        restore(spark, root, ConnectionSettings.at(port=1))


# -- pure helpers ---------------------------------------------------------------------------


def test_parse_to_seqnos_forms(tmp_path: Path) -> None:
    assert parse_to_seqnos('{"0": 5, "3": 9}') == {0: 5, 3: 9}
    offsets = {"format": 1, "vbuckets": {"2": {"vb_uuid": "7", "seqno": "4", "snap_start": "4",
                                               "snap_end": "4"}}}  # fmt: skip
    assert parse_to_seqnos(json.dumps(offsets)) == {2: 4}
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"run": 1, "end": offsets}))
    assert parse_to_seqnos(str(path)) == {2: 4}
    with pytest.raises(BackupError):
        parse_to_seqnos("[1, 2]")


def test_cut_points_pick_the_first_run_that_reached_the_seqno(scenario: Scenario) -> None:
    runs = committed_runs(scenario.root)
    v = next(iter(sorted({vb(k) for k in scenario.b_keys})))
    end1, end2 = runs[0].end[v].offset.seqno, runs[1].end[v].offset.seqno
    assert cut_points(runs, {v: end1}) == {v: (1, end1)}
    assert cut_points(runs, {v: end2}) == {v: (2, end2)}
    assert cut_points(runs, {v: 10**9}) == {v: (4, 10**9)}


def test_an_empty_run_joins_the_chain(scenario: Scenario) -> None:
    run3, run4 = committed_runs(scenario.root)[2:]
    assert run4.manifest["totals"] == {
        "mutations": 0, "deletions": 0, "expirations": 0, "changes": 0, "rows": 0
    }  # fmt: skip
    assert run4.manifest["start"] == run3.manifest["end"]
