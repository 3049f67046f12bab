"""The automatic failover decision, table-driven: durations, settings, count and map in; the
node to fail over, or why each unresponsive node is held, out."""

from __future__ import annotations

import pytest

from dcpkv.cluster.auto_failover import Decision, Policy, decide
from dcpkv.cluster.vbucket_map import VBucketMap

A, B, C = "h:1", "h:2", "h:3"
# 3 nodes, 1 replica: every vbucket has a replica elsewhere
ONE_REPLICA = VBucketMap((A, B, C), ((0, 1), (1, 2), (2, 0), (0, 2)), 1)
# after one failover with 1 replica: B's vbucket 1 has no replica left
NO_REPLICA = VBucketMap((B, C), ((0, 1), (0, -1), (1, 0)), 1)
ON = Policy(enabled=True, timeout_s=5, count=0)


@pytest.mark.parametrize(
    ("down_for", "policy", "vb_map", "node", "held"),
    [
        pytest.param({A: 0, B: 0, C: 0}, ON, ONE_REPLICA, None, {}, id="all-answer"),
        pytest.param({A: 4.9, B: 0, C: 0}, ON, ONE_REPLICA, None, {}, id="not-yet-timeout"),
        pytest.param({A: 5.0, B: 0, C: 0}, ON, ONE_REPLICA, A, {}, id="at-timeout"),
        pytest.param({A: 0, B: 0, C: 30}, ON, ONE_REPLICA, C, {}, id="long-down"),
        pytest.param(
            {A: 9, B: 0, C: 0},
            Policy(enabled=False, timeout_s=5, count=0),
            ONE_REPLICA,
            None,
            {A: "auto-failover is off"},
            id="switched-off",
        ),
        pytest.param(
            {A: 9, B: 0, C: 0},
            Policy(enabled=True, timeout_s=5, count=1),
            ONE_REPLICA,
            None,
            {A: "quota is used (1 of 1)"},
            id="quota-used",
        ),
        pytest.param(
            {A: 9, B: 6, C: 0},
            ON,
            ONE_REPLICA,
            None,
            {A: "2 nodes are unresponsive at once", B: "2 nodes are unresponsive at once"},
            id="two-at-once",
        ),
        pytest.param(
            {A: 9, B: 2, C: 0},
            ON,
            ONE_REPLICA,
            None,
            {A: "vbucket 0 is active on it and no replica of it answers"},
            id="its-replica-is-down-too",
        ),
        pytest.param(
            {B: 9, C: 0},
            ON,
            NO_REPLICA,
            None,
            {B: "vbucket 1 is active on it and has no replica"},
            id="no-replica",
        ),
        pytest.param({B: 0, C: 9}, ON, NO_REPLICA, C, {}, id="holds-only-replicated-actives"),
        pytest.param(
            {A: 9},
            ON,
            VBucketMap((A,), ((0,),), 0),
            None,
            {A: "no other node answers"},
            id="last-node",
        ),
    ],
)
def test_decide(
    down_for: dict[str, float],
    policy: Policy,
    vb_map: VBucketMap,
    node: str | None,
    held: dict[str, str],
) -> None:
    decision = decide(down_for, policy, [vb_map])
    assert decision.node == node
    assert set(decision.held) == set(held)
    for name, fragment in held.items():
        assert fragment in decision.held[name]
    if node is not None:
        assert "unresponsive for" in decision.reason and node not in decision.held


def test_a_node_in_no_map_is_failed_over_without_map_checks() -> None:
    """A member the map does not name yet (added, waiting for rebalance) holds nothing."""
    decision = decide({A: 0, B: 0, C: 0, "h:4": 7}, ON, [ONE_REPLICA])
    assert decision == Decision(node="h:4", reason="unresponsive for 7.0 s (timeout 5 s)")
