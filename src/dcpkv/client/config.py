"""Settings of a DCP client (:class:`dcpkv.client.consumer.Consumer`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dcpkv.client.settings import ConnectionSettings


@dataclass(frozen=True)
class ClientConfig:
    """Where to connect, as whom (``connection``), and how the DCP connection behaves.

    ``buffer_size`` is the flow-control window negotiated with ``connection_buffer_size``
    (0 disables flow control); ``noop_interval`` the producer's Noop period in seconds (the
    connection counts as dead after two silent intervals); ``max_backoff`` caps the delay
    between reconnection attempts; ``retry_timeout`` is how long a request keeps retrying
    while the cluster map catches up with a failover or a vbucket move
    (``dcpkv.client.cluster``), ``request_timeout`` how long one attempt waits for its answer
    (a node that accepts connections but does not answer counts as lost).
    ``include_values=False`` opens the DCP connection with the NoValue flag: mutations arrive
    with an empty value and datatype 0 (raw), for consumers that only need keys and metadata
    (the producer then never reads ejected values back from disk).
    ``compression=True`` asks the producer to Snappy-compress every value it sends
    (``force_value_compression``): fewer bytes on the wire for more CPU on both sides. Events
    carry inflated values either way (the connection always negotiates Snappy, so values the
    bucket keeps compressed arrive as they are stored and are inflated here).
    ``include_prepares=True`` enables SyncWrites on the DCP connection: durable writes arrive
    as :class:`~dcpkv.client.events.Prepare`, then :class:`~dcpkv.client.events.Commit` or
    :class:`~dcpkv.client.events.Abort` events (a prepare is not visible to readers until its
    commit; a disk snapshot brings a committed one as a plain Mutation). Off by default:
    committed changes only, a commit as the Mutation or Deletion it made.
    """

    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    name: str = "dcpkv-client"
    buffer_size: int = 20 * 1024 * 1024
    noop_interval: float = 10.0
    connect_timeout: float = 10.0
    max_backoff: float = 5.0
    retry_timeout: float = 30.0
    request_timeout: float = 2.5
    include_values: bool = True
    compression: bool = False
    include_prepares: bool = False
