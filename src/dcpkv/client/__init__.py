"""The client library: follow a bucket's changes, resumably and rollback-correct, and read and
write its documents.

Everything a user needs is importable from here::

    from dcpkv.client import ClientSettings, ConnectionSettings, Offsets, SyncConsumer

* ``ConnectionSettings``, ``TlsSettings``: where to connect (a node, or a connection string
  ``couchbase://h1,h2``), the bucket, the user, TLS; ``ClientSettings``: a consumer's settings,
  the connection plus its own knobs.
* ``SyncConsumer`` (blocking) and ``Consumer`` (asyncio): DCP consumers of one bucket. They
  yield events (``Mutation``, ``Deletion``, ``Expiration``, ``Rollback``, ``StreamStart``,
  ``StreamEnd``, ...; ``Event`` is their union), each carrying ``offset``, the vbucket's
  offset after it.
* ``Offsets`` (of ``VbucketOffset``): where a consumer is in each vbucket's history, saved
  atomically to a file and resumed from on the next run.
* ``MutationLog``: spec 002's ring buffer of recent keys; after a rollback the consumer
  re-fetches and hands over the current version of every key it must undo.
* ``ClusterKV``: the asyncio KV client of a cluster, routed by the cluster map: upsert, insert,
  replace, remove, append, prepend, incr, decr and sub-document ``mutate_in``, each returning
  a ``MutationToken``, with ``durability=`` (a ``Durability`` level or a ``ServerDurability``
  with a timeout: the server commits the write at that level before answering, a SyncWrite)
  or, for upsert, client durability (``persist_to``, ``replicate_to``: ObserveSeqno
  polling); ``Document``, a Get's answer.
* ``BlockingKV``: the blocking KV client of one node (pipelined windows); ``KVWriter`` and
  ``WriteOp``: routed, retried bulk writes over it.
* The errors a caller catches, all of them ``DcpkvError``: ``ClientError`` (``AuthError``,
  ``StreamFailedError``, ``NoRouteError``), ``RequestFailed``, ``KVWriteError``,
  ``DurabilityError`` (``...ImpossibleError``, ``...LostError``, ``...TimeoutError``, and
  ``SyncWriteError``, the server's SyncWrite refusals: ``DurabilityInvalidLevelError``,
  ``SyncWriteImpossibleError``, ``SyncWriteInProgressError``, ``SyncWriteAmbiguousError``,
  ``SyncWriteReCommitInProgressError``, each with its ``retry`` hint),
  ``OffsetsFileError``, ``NodeAddressError``.

The names are imported on first use, not with the package: the commands and Spark's Python
processes import single modules of the package (``dcpkv.client.settings``, say), and importing
the consumer with them would cost each of those processes the consumer's imports (asyncio,
the codec), hundreds of times what the package itself costs.

Theory of operation
-------------------
Clients stand on the codec (``protocol``) and the neutral core only, never on the server side
(the layer contract in pyproject.toml). ``settings`` is where to connect and as whom;
``connection``/``kv`` the asyncio KV client, ``blocking``/``writer`` the blocking one and its
pipelined bulk writer; ``cluster`` the map-routed KV client and its durability;
``consumer``, ``consumer_stream``, ``sync`` the DCP consumer; ``offsets``, ``rollback_point``,
``mutation_log`` what a consumer keeps.
"""

TYPE_CHECKING = False  # not typing's: importing typing would cost the package's importers
if TYPE_CHECKING:
    from dcpkv.client.blocking import BlockingKV, RequestFailed
    from dcpkv.client.cluster import ClusterKV, NoRouteError
    from dcpkv.client.connection import AuthError, ClientError
    from dcpkv.client.consumer import Consumer, StreamFailedError
    from dcpkv.client.durability import (
        Durability,
        DurabilityInvalidLevelError,
        ServerDurability,
        SyncWriteAmbiguousError,
        SyncWriteError,
        SyncWriteImpossibleError,
        SyncWriteInProgressError,
        SyncWriteReCommitInProgressError,
    )
    from dcpkv.client.events import (
        Deletion,
        Event,
        Expiration,
        Mutation,
        Rollback,
        SeqnoAdvanced,
        SnapshotStart,
        StreamEnd,
        StreamRefused,
        StreamStart,
    )
    from dcpkv.client.kv import Document
    from dcpkv.client.mutation_log import MutationLog
    from dcpkv.client.offsets import Offsets, OffsetsFileError, VbucketOffset
    from dcpkv.client.settings import ClientSettings, ConnectionSettings, NodeAddressError
    from dcpkv.client.sync import SyncConsumer
    from dcpkv.client.writer import KVWriteError, KVWriter, WriteOp
    from dcpkv.core.durability import (
        DurabilityError,
        DurabilityImpossibleError,
        DurabilityLostError,
        DurabilityTimeoutError,
        MutationToken,
    )
    from dcpkv.core.errors import DcpkvError
    from dcpkv.core.tls import TlsSettings

# Where each public name is defined: the module is imported when the name is first asked for.
_HOMES: dict[str, tuple[str, ...]] = {
    "dcpkv.client.settings": ("ClientSettings", "ConnectionSettings", "NodeAddressError"),
    "dcpkv.core.tls": ("TlsSettings",),
    "dcpkv.client.sync": ("SyncConsumer",),
    "dcpkv.client.consumer": ("Consumer", "StreamFailedError"),
    "dcpkv.client.offsets": ("Offsets", "OffsetsFileError", "VbucketOffset"),
    "dcpkv.client.mutation_log": ("MutationLog",),
    "dcpkv.client.events": (
        "Deletion",
        "Event",
        "Expiration",
        "Mutation",
        "Rollback",
        "SeqnoAdvanced",
        "SnapshotStart",
        "StreamEnd",
        "StreamRefused",
        "StreamStart",
    ),
    "dcpkv.client.cluster": ("ClusterKV", "NoRouteError"),
    "dcpkv.client.kv": ("Document",),
    "dcpkv.core.durability": (
        "DurabilityError",
        "DurabilityImpossibleError",
        "DurabilityLostError",
        "DurabilityTimeoutError",
        "MutationToken",
    ),
    "dcpkv.client.durability": (
        "Durability",
        "DurabilityInvalidLevelError",
        "ServerDurability",
        "SyncWriteAmbiguousError",
        "SyncWriteError",
        "SyncWriteImpossibleError",
        "SyncWriteInProgressError",
        "SyncWriteReCommitInProgressError",
    ),
    "dcpkv.client.blocking": ("BlockingKV", "RequestFailed"),
    "dcpkv.client.writer": ("KVWriteError", "KVWriter", "WriteOp"),
    "dcpkv.client.connection": ("AuthError", "ClientError"),
    "dcpkv.core.errors": ("DcpkvError",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "AuthError",
    "BlockingKV",
    "ClientError",
    "ClientSettings",
    "ClusterKV",
    "ConnectionSettings",
    "Consumer",
    "DcpkvError",
    "Deletion",
    "Document",
    "Durability",
    "DurabilityError",
    "DurabilityImpossibleError",
    "DurabilityInvalidLevelError",
    "DurabilityLostError",
    "DurabilityTimeoutError",
    "Event",
    "Expiration",
    "KVWriteError",
    "KVWriter",
    "Mutation",
    "MutationLog",
    "MutationToken",
    "NoRouteError",
    "NodeAddressError",
    "Offsets",
    "OffsetsFileError",
    "RequestFailed",
    "Rollback",
    "SeqnoAdvanced",
    "ServerDurability",
    "SnapshotStart",
    "StreamEnd",
    "StreamFailedError",
    "StreamRefused",
    "StreamStart",
    "SyncConsumer",
    "SyncWriteAmbiguousError",
    "SyncWriteError",
    "SyncWriteImpossibleError",
    "SyncWriteInProgressError",
    "SyncWriteReCommitInProgressError",
    "TlsSettings",
    "VbucketOffset",
    "WriteOp",
]


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use (then kept in the package)."""
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
