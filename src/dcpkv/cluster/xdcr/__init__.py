"""XDCR: replicating a bucket to another cluster over DCP (docs/xdcr.md).

Sans-I/O cores: ``checkpoints`` (what a replication keeps per vbucket and which checkpoint it
resumes from), ``pipeline`` (filters, batches, the optimistic threshold, the with-meta
requests), ``spec`` (remote clusters, replications and their settings). Shells:
``replicator`` (one replication: a DCP consumer of the source, a routed KV client of the
target), ``service`` (the manager's replications, their store and their REST routes).
"""
