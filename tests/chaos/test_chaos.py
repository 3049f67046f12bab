"""Short seeded runs of the fault-injection suite (``make chaos`` runs it for 30 minutes):
one manager; and managers on etcd with the faults of the leader and of etcd (``long``: run by
``make chaos-test`` or ``pytest -m long``, not by ``make test``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import ETCD_FAULTS, run
from support.etcdproc import require_etcd


def test_a_short_seeded_chaos_run_loses_nothing_and_ends_equal(tmp_path: Path) -> None:
    report = run(seed=20261123, duration_s=20, workdir=tmp_path)
    assert report.faults and report.acknowledged and report.confirmed, report.summary()
    assert report.durable is not None and report.durable.acknowledged, report.summary()
    assert report.ok, "\n".join([report.summary(), *report.problems, *report.history])


@pytest.mark.long
def test_a_short_run_with_managers_on_etcd_loses_nothing_and_the_next_leader_finishes(
    tmp_path: Path,
) -> None:
    """Each fault of managers and etcd in turn: the leader killed while a failover is due
    (the node recovered next), stopped past its lease, an etcd member killed, the leader
    killed mid-rebalance, then alone, a follower stopped, the leader cut off from etcd; the
    next leader finishes each, a manager leads at the end, the leader cut off stopped acting
    before another won, nothing is lost or divergent."""
    require_etcd()
    faults = ("leader-failover", "recover", *ETCD_FAULTS[1:])
    report = run(seed=3201, duration_s=75, workdir=tmp_path, etcd=True, faults=faults)
    assert set(report.faults) == set(faults), report.summary()
    assert report.acknowledged and report.confirmed, report.summary()
    assert report.stale_refused is not None, report.summary()
    assert report.cut_margins, report.summary()  # (its stop and the next win were seen)
    assert report.ok, "\n".join([report.summary(), *report.problems, *report.history])
