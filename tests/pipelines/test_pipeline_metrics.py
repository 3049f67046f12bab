"""A Spark pipeline's Prometheus metrics (dcpkv.pipelines.metrics): what batches add up to,
served on a real loopback port and checked by ``promtool check metrics``."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

from dcpkv.pipelines.metrics import PipelineMetrics
from dcpkv.pipelines.table_job import BatchStats
from support.promcheck import promtool_check, samples


@pytest.fixture
def metrics() -> Iterator[PipelineMetrics]:
    served = PipelineMetrics("view:by_country")
    yield served
    served.stop()


def test_batches_add_up_and_are_served_in_a_valid_format(metrics: PipelineMetrics) -> None:
    port = metrics.serve("127.0.0.1", 0)
    metrics.on_batch(BatchStats(0, 1_700_000_000.0, 100, 0, 0.4, 25, lag_s=0.3, visible_s=0.35))
    metrics.on_batch(BatchStats(1, 1_700_000_001.0, 7, 3, 2.0, None, lag_s=None))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    promtool_check(text)
    got = samples(text)
    p = '{pipeline="view:by_country"}'
    assert got[f"dcpkv_pipeline_batches_total{p}"] == 2
    assert got[f"dcpkv_pipeline_rows_total{p}"] == 107
    assert got[f"dcpkv_pipeline_rollback_rows_total{p}"] == 3
    assert got[f"dcpkv_pipeline_lag_items{p}"] == 25  # a batch that could not ask keeps it
    assert got[f"dcpkv_pipeline_lag_seconds{p}"] == 0.3
    assert got[f"dcpkv_pipeline_last_batch_timestamp_seconds{p}"] == 1_700_000_001.0
    assert got[f"dcpkv_pipeline_batch_duration_seconds_count{p}"] == 2
    assert got[f"dcpkv_pipeline_batch_duration_seconds_sum{p}"] == pytest.approx(2.4)
    assert not any("_created" in name for name in got)


def test_a_pipeline_without_batches_shows_zeros(metrics: PipelineMetrics) -> None:
    port = metrics.serve("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        got = samples(answer.read().decode())
    assert got['dcpkv_pipeline_batches_total{pipeline="view:by_country"}'] == 0
    assert not any(name.startswith("dcpkv_pipeline_lag_items") for name in got)
