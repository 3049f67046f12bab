"""The data engine: vbuckets, the failover table, the rollback rules, checkpoints, storage."""
