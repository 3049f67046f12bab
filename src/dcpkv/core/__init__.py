"""The neutral core: facts every layer shares, and nothing else of the project.

Theory of operation
-------------------
The codec, the engine, the producer, the server, the clients, Spark and the pipelines all
speak of the same few things: a vbucket's history (failover entries, the table, the rollback
rules), 64-bit seqnos and uuids, which vbucket a key lives in, the state of a vbucket, and
what a status code means (may the request be retried, must the cluster map be refreshed).
They are defined here once, as plain values without I/O, so that no layer has to reach into
another to learn them. This package imports nothing else of ``dcpkv`` (the layer contract in
``pyproject.toml`` enforces it). The modules, one concept each:

``seqno``           U64_MAX, the seqno and uuid types      ``vbucket``   key hashing, VBucketState
``failover_table``  a vbucket's branches, JSON/wire forms  ``rollback``  the producer's decision
``status``          status codes and their error-map attributes (retryable, refresh the map)
``errors``          DcpkvError, the root of every exception the project raises
``defaults``        the embedded host, port, bucket and credentials server and clients share
``files``           the durable atomic replacement of a file (write, fsync, rename, fsync dir)
"""
