"""The client library: connection settings, KV clients (asyncio and blocking), DCP consumers,
offsets, the consumer's rollback point.

Theory of operation
-------------------
Clients stand on the codec (``protocol``) and the neutral core only, never on the server side
(the layer contract in pyproject.toml). ``settings`` is where to connect and as whom;
``connection``/``kv`` the asyncio KV client, ``blocking``/``writer`` the blocking one and its
pipelined bulk writer; ``consumer``, ``consumer_stream``, ``sync`` the DCP consumer;
``offsets``, ``rollback_point``, ``mutation_log`` what a consumer keeps.
"""
