"""The manager's Prometheus metrics (``GET /metrics``) and its targets list (``GET
/prometheus_sd_config``).

Theory of operation
-------------------
:func:`families` reads the manager's state as it is (the configuration, the health watcher,
the rebalance's progress, the events this process logged, :func:`dcpkv.core.logs.event_counts`)
and :func:`render` writes Prometheus text; both run in the HTTP handler on the manager's loop,
and cost a scrape a pass over the nodes. Names use the reference manager's ``cm_`` prefix:

==================================  ===============  =======================================
name                                labels           what
==================================  ===============  =======================================
cm_nodes                            membership,      nodes of the cluster (active/failed,
                                    status           and the health watcher's word)
cm_node_vbuckets                    node, state      active and replica vbuckets per node
cm_rebalance_running                                 1 while a rebalance runs
cm_rebalance_progress                                vbuckets moved / total of the last run
cm_rebalance_vbuckets_moved                          moves done of the last run
cm_rebalance_vbuckets_planned                        moves planned of the last run
cm_rebalance_items_transferred                       items the new copies received
cm_rebalance_eta_seconds                             the estimate of the time left (running)
cm_rebalance_started_count                           rebalances started by this process
cm_rebalance_steps_count                             vbucket moves ended
cm_rebalance_ended_count            result           rebalances ended: done, stopped, failed
cm_failover_count                                    failovers (by hand or automatic)
cm_auto_failovers_unacknowledged                     automatic failovers not acknowledged
cm_auth_failures                                     HTTP requests refused for credentials
cm_maps_pushed, cm_set_vbucket_sent                  what the links to the nodes did
==================================  ===============  =======================================

Counts of this process start at 0 when the manager starts (``rate()`` handles the reset).

``/prometheus_sd_config`` answers Prometheus' HTTP service discovery format: the manager
itself (its own ``/metrics``, with the scrape job's credentials) and every data node that
serves metrics (``dcpkv server --metrics-port``; a node's port is asked of the node with
``stat``), each with a ``dcpkv_role`` label (``manager`` or ``data``) and the node's name.
A node that does not answer is left out of that answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from dcpkv.cluster.node_link import NodeLinkError
from dcpkv.core.deadline import within
from dcpkv.core.logs import event_counts

if TYPE_CHECKING:
    from dcpkv.cluster.manager import Manager

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SD_TIMEOUT_S = 5.0


def _counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    """A count under the reference's style of name (no ``_total``): untyped."""
    metric = Metric(name, doc, "unknown")
    metric.add_sample(name, labels or {}, value)
    return metric


def _gauge(name: str, doc: str, value: float) -> Metric:
    return GaugeMetricFamily(name, doc, value=value)


def families(manager: Manager, now: float | None = None) -> list[Metric]:
    """Every metric of the manager, read now."""
    return [*_nodes(manager), *_rebalance(manager, now), *_counts(manager)]


def _nodes(manager: Manager) -> Iterator[Metric]:
    nodes = GaugeMetricFamily("cm_nodes", "Nodes of the cluster", labels=["membership", "status"])
    tally: dict[tuple[str, str], int] = {}
    for node in manager.config.nodes:
        key = (node.state.value, manager._health_of(node))
        tally[key] = tally.get(key, 0) + 1
    for (membership, status), count in sorted(tally.items()):
        nodes.add_metric([membership, status], count)
    yield nodes
    vbuckets = GaugeMetricFamily(
        "cm_node_vbuckets", "Active and replica vbuckets per node", labels=["node", "state"]
    )
    held = {node.name: [0, 0] for node in manager.config.nodes}
    for bucket in manager.config.buckets:
        for name, counts in (bucket.map.counts() if bucket.map is not None else {}).items():
            for i, count in enumerate(counts):
                held.setdefault(name, [0, 0])[i] += count
    for name, (actives, replicas) in held.items():
        vbuckets.add_metric([name, "active"], actives)
        vbuckets.add_metric([name, "replica"], replicas)
    yield vbuckets


def _rebalance(manager: Manager, now: float | None) -> Iterator[Metric]:
    rebalancer = manager.rebalancer
    progress = rebalancer.progress.to_json(time.monotonic() if now is None else now)
    total, moved = progress["vbucketsTotal"], progress["vbucketsMoved"]
    yield _gauge("cm_rebalance_running", "1 while a rebalance runs", int(rebalancer.running))
    yield _gauge(
        "cm_rebalance_progress",
        "Fraction of the last rebalance's vbucket moves done (1 when it had none)",
        moved / total if total else 1.0,
    )
    yield _gauge("cm_rebalance_vbuckets_moved", "vbucket moves done, last rebalance", moved)
    yield _gauge("cm_rebalance_vbuckets_planned", "vbucket moves planned, last rebalance", total)
    yield _gauge(
        "cm_rebalance_items_transferred",
        "Items the new copies received, last rebalance",
        progress["itemsTransferred"],
    )
    eta = progress["eta"] if rebalancer.running else None
    yield _gauge(
        "cm_rebalance_eta_seconds",
        "Estimated seconds left of the running rebalance (0 when none runs or none is known)",
        eta or 0.0,
    )


def _counts(manager: Manager) -> Iterator[Metric]:
    events = event_counts()
    yield _counter(
        "cm_rebalance_started_count", "Rebalances started", events.get("rebalance_start", 0)
    )
    yield _counter(
        "cm_rebalance_steps_count", "vbucket moves ended", events.get("rebalance_step", 0)
    )
    ended = Metric("cm_rebalance_ended_count", "Rebalances ended, by result", "unknown")
    for result in ("done", "stopped", "failed"):
        ended.add_sample(ended.name, {"result": result}, events.get(f"rebalance_end:{result}", 0))
    yield ended
    yield _counter(
        "cm_failover_count", "Failovers, by hand or automatic", events.get("failover", 0)
    )
    yield _gauge(
        "cm_auto_failovers_unacknowledged",
        "Automatic failovers an operator has not acknowledged",
        manager.config.settings.auto_failover_count,
    )
    yield _counter(
        "cm_auth_failures", "HTTP requests refused for their credentials",
        events.get("auth_failure", 0),
    )  # fmt: skip
    counters = manager.counters
    yield _counter("cm_maps_pushed", "Cluster maps pushed to nodes", counters.maps_pushed)
    yield _counter(
        "cm_set_vbucket_sent", "vbucket state changes sent to nodes", counters.set_vbucket_sent
    )


class _Snapshot(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def render(metrics: list[Metric]) -> bytes:
    """Prometheus text (format 0.0.4) of ``metrics``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics))
    return generate_latest(registry)


async def sd_targets(manager: Manager, manager_address: str) -> list[dict[str, Any]]:
    """Prometheus HTTP service discovery: the manager, then each node serving metrics."""
    groups: list[dict[str, Any]] = [
        {"targets": [manager_address], "labels": {"dcpkv_role": "manager"}}
    ]
    bucket = manager.config.buckets[0].name if manager.config.buckets else "default"
    nodes = [n for n in manager.config.nodes if n.name in manager.links]
    ports = await asyncio.gather(*(_metrics_port(manager, n.name, bucket) for n in nodes))
    for node, port in zip(nodes, ports, strict=True):
        if port:
            groups.append({
                "targets": [f"{node.host}:{port}"],
                "labels": {"dcpkv_role": "data", "dcpkv_node": node.name},
            })  # fmt: skip
    return groups


async def _metrics_port(manager: Manager, name: str, bucket: str) -> int:
    try:
        return await within(manager.links[name].metrics_port(bucket), SD_TIMEOUT_S)
    except (NodeLinkError, OSError, TimeoutError):
        return 0
