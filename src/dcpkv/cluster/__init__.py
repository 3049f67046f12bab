"""Replicas fed by DCP, failover and rebalance."""
