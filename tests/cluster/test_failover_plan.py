"""The failover decision (sans-I/O) and the configuration file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.cluster import config as cfg
from dcpkv.cluster import failover
from dcpkv.cluster.failover import (
    FailoverRefused,
    ReplicaSeqnos,
    plan_failover,
    vbuckets_to_promote,
)
from dcpkv.cluster.vbucket_map import NOBODY, VBucketMap, plan_initial

A, B, C = "h:1", "h:2", "h:3"


def three_node_map() -> VBucketMap:
    # vb0: A active, B and C replicas; vb1: B active, A C; vb2: C active, A B; vb3: A, C B
    chains = ((0, 1, 2), (1, 0, 2), (2, 0, 1), (0, 2, 1))
    return VBucketMap((A, B, C), chains, 2, rev=4)


def seqnos(persisted: int) -> ReplicaSeqnos:
    """A replica without SyncWrites: no prepare, everything it holds persisted."""
    return ReplicaSeqnos(0, persisted, persisted)


def test_the_replica_furthest_ahead_takes_over_and_a_leaves_the_map() -> None:
    current = three_node_map()
    assert vbuckets_to_promote(current, A) == {0: [B, C], 3: [C, B]}
    reported = {0: {B: seqnos(5), C: seqnos(8)}, 3: {C: seqnos(3), B: seqnos(3)}}
    plan = plan_failover(current, A, reported)
    assert plan.promotions == {0: C, 3: C}
    new = plan.new_map
    assert new.servers == (B, C) and new.rev == 5
    # indexes now: B=0, C=1
    assert new.chains == ((1, 0, NOBODY), (0, 1, NOBODY), (1, 0, NOBODY), (1, 0, NOBODY))


R = ReplicaSeqnos


@pytest.mark.parametrize(
    ("rule", "b", "c", "promoted"),
    [
        ("F1 the highest high prepared seqno, though behind", R(7, 8, 8), R(6, 9, 9), B),
        ("F1 the same, the other way", R(6, 9, 9), R(7, 8, 8), C),
        ("F2 equal HPS: the highest high seqno", R(4, 8, 5), R(4, 9, 4), C),
        ("F3 equal HPS and high seqno: the most persisted", R(4, 9, 9), R(4, 9, 5), B),
        ("F4 all equal: the first replica of the chain", R(4, 9, 9), R(4, 9, 9), B),
        ("F5 a replica that did not answer is no candidate", R(9, 9, 9), None, B),
        ("F5 the same, the other way", None, R(0, 0, 0), C),
    ],
)
def test_failover_promotes_by_high_prepared_seqno_then_high_seqno(
    rule: str, b: ReplicaSeqnos | None, c: ReplicaSeqnos | None, promoted: str
) -> None:
    current = VBucketMap((A, B, C), ((0, 1, 2),), 2)
    answered = {name: r for name, r in ((B, b), (C, c)) if r is not None}
    assert plan_failover(current, A, {0: answered}).promotions == {0: promoted}, rule


def test_every_rule_of_the_docstring_table_is_tested() -> None:
    documented = set(re.findall(r"^(F\d+) ", failover.__doc__ or "", re.M))
    assert documented == {"F1", "F2", "F3", "F4", "F5"}


@pytest.mark.parametrize(
    ("current", "failed", "persisted", "message"),
    [
        (VBucketMap((A,), ((0,),), 0), A, {}, "last node"),
        (
            VBucketMap((A, B), ((0, -1), (1, 0)), 1),
            A,
            {},
            "vbucket 0 is active on h:1 and has no replica",
        ),
        (VBucketMap((A, B), ((0, 1),), 1), A, {}, "no reachable replica"),
        (VBucketMap((A, B), ((0, 1),), 1), C, {}, "not in the vbucket map"),
    ],
)
def test_failover_is_refused_clearly(
    current: VBucketMap, failed: str, persisted: dict, message: str
) -> None:
    with pytest.raises(FailoverRefused, match=message):
        plan_failover(current, failed, persisted)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 6), st.integers(1, 3), st.integers(1, 64), st.data())
def test_after_any_failover_every_vbucket_is_active_on_a_survivor(
    nodes: int, replicas: int, vbuckets: int, data: st.DataObject
) -> None:
    replicas = min(replicas, nodes - 1)
    servers = tuple(f"h:{i}" for i in range(nodes))
    current = VBucketMap(servers, tuple(plan_initial(nodes, replicas, vbuckets)), replicas)
    failed = data.draw(st.sampled_from(servers))
    persisted = {
        vb: {s: seqnos(data.draw(st.integers(0, 9))) for s in reps}
        for vb, reps in vbuckets_to_promote(current, failed).items()
    }
    plan = plan_failover(current, failed, persisted)
    new = plan.new_map
    assert failed not in new.servers and new.rev == current.rev + 1
    for vb, chain in enumerate(new.chains):
        assert chain[0] != NOBODY
        old_active = current.servers[current.chains[vb][0]]
        expected = plan.promotions.get(vb, old_active)
        assert new.servers[chain[0]] == expected
        if vb in plan.promotions:
            assert persisted[vb][expected] == max(persisted[vb].values())


# -- the configuration file -----------------------------------------------------------------


def test_the_config_round_trips_through_its_file(tmp_path: Path) -> None:
    bucket = cfg.new_bucket("default", 4, 1)
    vb_map = VBucketMap((A, B), tuple(plan_initial(2, 1, 4)), 1, rev=3)
    config = cfg.ClusterConfig(
        nodes=(cfg.NodeConfig(A), cfg.NodeConfig(B), cfg.NodeConfig(C, cfg.NodeState.FAILED)),
        buckets=(cfg.BucketConfig(bucket.name, 4, 1, bucket.uuid, vb_map),),
        settings=cfg.FailoverConfig(True, 30, auto_failover_count=1, repair_on_rollback=True),
        events=(cfg.FailoverEvent(C, "unresponsive for 5.2 s", 1_790_000_000.5),),
    )
    assert cfg.load(tmp_path) is None
    cfg.save(tmp_path, config)
    assert cfg.load(tmp_path) == config
    assert not (tmp_path / "cluster.json.tmp").exists()


def test_a_config_saved_before_auto_failover_counts_none(tmp_path: Path) -> None:
    cfg.save(tmp_path, cfg.ClusterConfig(settings=cfg.FailoverConfig(True, 30)))
    doc = json.loads((tmp_path / "cluster.json").read_text())
    del doc["settings"]["autoFailover"]["count"]  # as the first manager wrote it
    del doc["settings"]["repairOnRollback"], doc["events"]
    (tmp_path / "cluster.json").write_text(json.dumps(doc))
    loaded = cfg.load(tmp_path)
    assert loaded is not None and loaded.settings == cfg.FailoverConfig(True, 30, 0, False)
    assert loaded.events == ()


@pytest.mark.parametrize(
    "raw", [b"{not json", b"[]", b'{"format": 99}', b'{"format": 1, "nodes": []}', b"\xff"]
)
def test_a_corrupt_config_is_a_clear_error(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "cluster.json").write_bytes(raw)
    with pytest.raises(cfg.ClusterConfigError, match="is corrupt"):
        cfg.load(tmp_path)
