# Every target creates .venv/ in the repo root on first use and installs the project into it,
# so a fresh clone needs nothing but Python 3.11+ and pip (and Java 17 for the Spark parts).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements.lock

.PHONY: run test test-fast lint bench clean venv fuzz chaos chaos-test lock lock-check

## venv: a fresh .venv from the lock (tools/lock.py): every package pinned and hash-checked, the
## project itself editable with the pinned build backend; made again whenever the lock changes
venv: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv --clear $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

## lock: requirements.lock again from pyproject.toml's ranges, keeping its pins where they still
## fit (UPGRADE=1: every package to the newest its range allows); needs PyPI, ~2 min
lock:
	$(PYTHON) tools/lock.py $(if $(UPGRADE),--upgrade)

## lock-check: fails when pyproject.toml's dependency declarations changed since the lock
lock-check:
	$(PYTHON) tools/lock.py --check

## run: the main job on the embedded defaults
run: $(STAMP)
	$(BIN)/dcpkv demo

## test: the lock's freshness, the Debian packages tests use (tools/install_test_packages.sh:
## etcd-server, prometheus, chromium; when missing and run as root), lint, the whole test suite
## on two pytest-xdist workers (the Spark tests together on one: tests/conftest.py)
test: lock-check $(STAMP)
	tools/install_test_packages.sh
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 --dist loadscope --durations=25

## test-fast: the tests that start no process (sans-I/O cores, codec, engine, planners):
## a minute or two, for the edit-test loop; make test runs them too, with everything else
FAST_TESTS := tests/core tests/protocol tests/engine tests/dcp \
	tests/client/test_client_offsets.py tests/client/test_consumer_sim.py \
	tests/client/test_consumer_stream.py tests/client/test_flow_control.py \
	tests/client/test_mutation_log.py tests/client/test_rollback_point.py \
	tests/client/test_session_policy.py tests/client/test_sync_decisions.py \
	tests/cluster/test_auto_failover_decision.py tests/cluster/test_failover_plan.py \
	tests/cluster/test_placement.py tests/cluster/test_rebalance_plan.py \
	tests/cluster/test_leadership.py \
	tests/cluster/test_vbucket_move.py tests/pipelines/test_compaction_due.py \
	tests/pipelines/test_mirror_floors.py tests/pipelines/test_report.py \
	tests/pipelines/test_resync_plan.py tests/pipelines/test_rewrite_swap.py \
	tests/pipelines/test_sample_data.py tests/pipelines/test_vtable_entries.py \
	tests/pipelines/test_pipeline_metrics.py \
	tests/cluster/console/test_dcp_backlog.py tests/cluster/console/test_sampling.py \
	tests/docs/test_docblocks.py tests/tools/test_lock.py
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(FAST_TESTS)

## lint: ruff, the layer contract (import-linter), mypy (see pyproject.toml for both)
lint: lock-check $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/lint-imports
	$(BIN)/mypy

## fuzz: a long seeded fuzzing run of the server's protocol handling (make test runs 120
## examples of the same test; this runs FUZZ_EXAMPLES, about 40 s per 2,000)
FUZZ_EXAMPLES ?= 20000
fuzz: $(STAMP)
	DCPKV_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q tests/server/test_fuzz.py

## chaos: the fault-injection suite on a local cluster under load (kill -9, SIGSTOP, cut
## connections, manager restarts, a failover), then the checks; CHAOS_SEED replays a run;
## CHAOS_ARGS=--etcd: 3 etcd members and a manager per node, and faults of the leading
## manager (kill -9 mid-failover or mid-rebalance, SIGSTOP past its lease) and of etcd members
CHAOS_DURATION ?= 1800
CHAOS_SEED ?=
CHAOS_ARGS ?=
chaos: $(STAMP)
	$(BIN)/python tests/chaos/chaos.py --duration $(CHAOS_DURATION) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) $(CHAOS_ARGS)

## chaos-test: the short seeded chaos runs, the long ones too (marked long: make test skips
## them), the managers-on-etcd run among them
chaos-test: $(STAMP)
	$(BIN)/python -m pytest -q -m "long or not long" tests/chaos

## bench: the peers (bench/install_peers.sh: Debian's memcached, Redis, PostgreSQL when missing
## and run as root), the machine and every version it runs with, the yardstick, every benchmark
## under bench/ (each between two timings of the yardstick, its figures as JSON in bench/results/),
## the peers of shared/peerbench/, the yardstick again, one summary (bench/README.md)
RESULTS := bench/results
# engine.py also runs this commit's copy, one with the SQLite engine (bench/_before.py)
SQLITE_COMMIT ?= 0ee2ad0
# kv_growth's bucket (10M keys, ~2 GB on disk) kept for bench/large_bucket.py, then removed
LARGE_KEYS ?= 10000000
LARGE_DIR ?= $(or $(BENCH_DIR),/tmp)/dcpkv-bench-large
bench: $(STAMP)
	PYTHON=$(PYTHON) bench/install_peers.sh
	rm -rf $(RESULTS) && mkdir -p $(RESULTS)
	$(BIN)/python bench/machine.py --json $(RESULTS)/machine.json
	$(BIN)/python bench/yardstick.py --name yardstick_start --json $(RESULTS)/yardstick_start.json
	$(BIN)/python bench/yardstick.py --kind memory --name memory_yardstick_start \
		--json $(RESULTS)/memory_yardstick_start.json
	$(BIN)/python bench/codec.py --json $(RESULTS)/codec.json
	$(BIN)/python bench/engine.py --before $(SQLITE_COMMIT) --json $(RESULTS)/engine.json
	$(BIN)/python bench/kv.py --json $(RESULTS)/kv.json
	rm -rf $(LARGE_DIR)
	$(BIN)/python bench/kv_growth.py --ops $(LARGE_KEYS) --segments 100 --quota-mb 7500 \
		--keep $(LARGE_DIR) --json $(RESULTS)/kv_growth.json
	$(BIN)/python bench/large_bucket.py --data-dir $(LARGE_DIR) --items $(LARGE_KEYS) \
		--value-only-quota-mb 7500 --quota-mb 512 --json $(RESULTS)/large_bucket.json; \
		rc=$$?; rm -rf $(LARGE_DIR); exit $$rc
	$(BIN)/python bench/dcp.py --json $(RESULTS)/dcp.json
	$(BIN)/python bench/stream.py --json $(RESULTS)/stream.json
	$(BIN)/python bench/spark_floor.py --json $(RESULTS)/spark_floor.json
	$(BIN)/python bench/spark.py --json $(RESULTS)/spark.json
	$(BIN)/python bench/demo_lag.py --rate 1000 --duration 60 --json $(RESULTS)/demo.json
	$(BIN)/python bench/fanout.py --json $(RESULTS)/fanout.json
	$(BIN)/python bench/latency.py --json $(RESULTS)/latency.json
	$(BIN)/python bench/memory.py --json $(RESULTS)/memory.json
	$(BIN)/python bench/eviction.py --json $(RESULTS)/eviction.json
	$(BIN)/python bench/bg_fetch.py --json $(RESULTS)/bg_fetch.json
	$(BIN)/python bench/replication.py --json $(RESULTS)/replication.json
	$(BIN)/python bench/rebalance.py --json $(RESULTS)/rebalance.json
	$(BIN)/python bench/durability.py --nodes 3 --json $(RESULTS)/durability.json
	$(BIN)/python bench/xdcr.py --json $(RESULTS)/xdcr.json
	$(BIN)/python bench/peers.py --results $(RESULTS)
	$(BIN)/python bench/yardstick.py --name yardstick_end --json $(RESULTS)/yardstick_end.json
	$(BIN)/python bench/yardstick.py --kind memory --name memory_yardstick_end \
		--json $(RESULTS)/memory_yardstick_end.json
	$(BIN)/python bench/summary.py $(RESULTS) --markdown $(RESULTS)/summary.md

clean:
	rm -rf $(VENV) .venv-peers .pytest_cache .hypothesis
