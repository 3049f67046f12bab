"""A Spark pipeline's Prometheus metrics (``dcpkv pipeline mirror --metrics-port``, ``dcpkv
view run --metrics-port``): what each batch's :class:`~dcpkv.pipelines.table_job.BatchStats`
says, on the job's own HTTP port.

Theory of operation
-------------------
:meth:`PipelineMetrics.on_batch` is a query's ``on_batch`` callback (it runs on the driver,
in Spark's thread for the query): it adds the batch to ``prometheus_client`` counters, gauges
and a histogram of one registry, which are thread-safe, and :meth:`PipelineMetrics.serve`
answers scrapes from a thread of its own. Nothing is read from Spark at scrape time. Each
series carries a ``pipeline`` label (``mirror``, or ``view:NAME``):

======================================  =========  =============================================
name                                    type       what
======================================  =========  =============================================
dcpkv_pipeline_batches_total            counter    batches applied and committed
dcpkv_pipeline_rows_total               counter    rows (changes) the batches applied
dcpkv_pipeline_rollback_rows_total      counter    rows taken back by rollbacks (history reset)
dcpkv_pipeline_lag_items                gauge      changes on the server not yet applied, after
                                                   the last batch (absent until known)
dcpkv_pipeline_lag_seconds              gauge      the last batch's oldest change: write to
                                                   commit
dcpkv_pipeline_batch_duration_seconds   histogram  a batch, start to commit and what follows
dcpkv_pipeline_last_batch_timestamp_    gauge      when the last batch finished (unix time)
seconds
======================================  =========  =============================================
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class PipelineMetrics:
    """One query's metrics, in a registry of their own."""

    def __init__(self, pipeline: str) -> None:
        disable_created_metrics()  # (no *_created series: a counter's start says nothing here)
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["pipeline"]
        r = self.registry
        self._batches = Counter("dcpkv_pipeline_batches", "Batches applied", labels, registry=r)
        self._rows = Counter("dcpkv_pipeline_rows", "Rows the batches applied", labels, registry=r)
        self._rollback_rows = Counter(
            "dcpkv_pipeline_rollback_rows", "Rows taken back by rollbacks", labels, registry=r
        )
        self._lag = Gauge(
            "dcpkv_pipeline_lag_items", "Changes not yet applied (last batch)", labels, registry=r
        )
        self._lag_s = Gauge(
            "dcpkv_pipeline_lag_seconds",
            "Seconds from the write of the last batch's oldest change to its commit",
            labels,
            registry=r,
        )
        self._seconds = Histogram(
            "dcpkv_pipeline_batch_duration_seconds", "A batch, start to commit", labels,
            buckets=_BUCKETS, registry=r,
        )  # fmt: skip
        self._finished = Gauge(
            "dcpkv_pipeline_last_batch_timestamp_seconds",
            "When the last batch finished (unix time)",
            labels,
            registry=r,
        )
        self.pipeline = pipeline
        self._batches.labels(pipeline)  # (the series exist, at 0, before the first batch)
        self._rows.labels(pipeline)
        self._rollback_rows.labels(pipeline)
        self._httpd: Any = None

    def on_batch(self, stats: Any) -> None:
        """A BatchStats (table_job.py): add it up."""
        p = self.pipeline
        self._batches.labels(p).inc()
        self._rows.labels(p).inc(stats.rows)
        self._rollback_rows.labels(p).inc(stats.rollbacks)
        self._seconds.labels(p).observe(stats.seconds)
        self._finished.labels(p).set(stats.finished_at)
        if stats.lag is not None:
            self._lag.labels(p).set(stats.lag)
        if stats.lag_s is not None:
            self._lag_s.labels(p).set(stats.lag_s)

    def serve(self, host: str, port: int) -> int:
        """Answer scrapes on ``host:port`` (0: a free port) from a thread; the bound port."""
        self._httpd, _ = start_http_server(port, host, self.registry)
        return int(self._httpd.server_port)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
