"""dcpkv: a partitioned key-value store with a correct, resumable change stream.

The path of a write:  client -> server (KV protocol) -> engine.vbucket -> engine.checkpoint
                      -> engine.flusher -> engine.storage
The path of a change: engine.checkpoint / disk backfill -> dcp.stream -> client.consumer
                      -> spark source -> pipelines
A history branch:     core.failover_table (new entry) -> core.rollback (the producer's
                      answer) -> client.rollback_point / every consumer rolls back

The layers, each importing only those below it (``make lint`` checks it, see pyproject.toml):
core < protocol < engine < dcp < server, and core/protocol < client < spark < pipelines;
cluster sits above server and client, app and cli on top.
"""

__version__ = "0.1.0"
