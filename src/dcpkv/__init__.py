"""dcpkv: a partitioned key-value store with a correct, resumable change stream.

The path of a write:  client -> server (KV protocol) -> engine.vbucket -> engine.checkpoint
                      -> engine.flusher -> engine.storage
The path of a change: engine.checkpoint / disk backfill -> dcp.stream -> client.consumer
                      -> spark source -> pipelines
A history branch:     engine.failover_table (new entry) -> engine.rollback (the producer's
                      answer) -> client.rollback_point / every consumer rolls back
"""

__version__ = "0.1.0"
