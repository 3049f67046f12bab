"""Settings of a DCP client (:class:`dcpkv.client.consumer.Consumer`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClientConfig:
    """Where to connect, as whom, and how the DCP connection behaves.

    ``buffer_size`` is the flow-control window negotiated with ``connection_buffer_size``
    (0 disables flow control); ``noop_interval`` the producer's Noop period in seconds (the
    connection counts as dead after two silent intervals); ``max_backoff`` caps the delay
    between reconnection attempts. ``include_values=False`` opens the DCP connection with the
    NoValue flag: mutations arrive with an empty value and datatype 0 (raw), for consumers that
    only need keys and metadata (the producer then never reads ejected values back from disk).
    """

    host: str = "127.0.0.1"
    port: int = 11210
    bucket: str = "default"
    user: str = "Administrator"
    password: str = "password"
    name: str = "dcpkv-client"
    buffer_size: int = 20 * 1024 * 1024
    noop_interval: float = 10.0
    connect_timeout: float = 10.0
    max_backoff: float = 5.0
    include_values: bool = True
