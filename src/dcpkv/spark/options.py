"""The options of the ``dcpkv`` Spark format, parsed once into a frozen value.

Theory of operation
-------------------
Spark hands a data source its options as a case-insensitive mapping of strings. Everything is
parsed and checked here, on the driver, when the source or sink is created, so that a typo is
a clear error at ``load()`` / ``start()`` time instead of a task failure on an executor. The
parsed :class:`SourceOptions` is a small frozen dataclass: it is pickled into every task.

``nodes`` or ``connectionString`` (``couchbase://h1,h2:11210``, ``host:port[,host:port...]``)
takes precedence over ``host``/``port``; they make the
:class:`~dcpkv.client.settings.ConnectionSettings` the source and sink connect with (the seeds
the client bootstraps the cluster map from). ``vbuckets`` is a list of ids and ranges
(``"0,1,5-9"``); empty means every vbucket the server has.

TLS: ``tls=true`` (or ``nodes`` given as ``couchbases://host:port``, the nodes' TLS ports)
makes every connection speak TLS; ``tlsCa`` is the CA file to trust (on every executor, at
the same path), ``tlsVerify=false`` skips verification (development only), ``tlsCert`` and
``tlsKey`` present a client certificate.

Sink only: ``durability`` (``none``, ``majority``, ``majorityAndPersistActive``,
``persistToMajority``) makes every write a SyncWrite answered once committed at that level;
``durabilityTimeoutMs`` is how long the server may take (default: the bucket's, 30 s).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dcpkv.client.durability import ServerDurability, parse_durability, server_durability
from dcpkv.client.settings import (
    ClientSettings,
    ConnectionSettings,
    Node,
    NodeAddressError,
    parse_nodes,
    parse_port,
    scheme_tls,
)
from dcpkv.core.defaults import (
    DEFAULT_BUCKET,
    DEFAULT_HOST,
    DEFAULT_PASSWORD,
    DEFAULT_PORT,
    DEFAULT_USER,
)
from dcpkv.core.errors import DcpkvError
from dcpkv.core.tls import TlsSettings
from dcpkv.spark.sparkoffsets import SparkOffsets

MODES = ("changes", "documents")


class OptionError(DcpkvError, ValueError):
    """An option of the ``dcpkv`` format has an unusable value."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    vbuckets: tuple[int, ...] = ()  # empty: all the server has
    starting: str | SparkOffsets = "earliest"  # "earliest", "latest" or offsets
    ending: str | SparkOffsets = "latest"  # batch "changes" mode only
    max_changes_per_trigger: int | None = None
    num_partitions: int | None = None  # None: plan.default_tasks (by the batch's size)
    include_values: bool = True
    mode: str = "changes"  # batch reads only
    durability: ServerDurability | None = None  # the sink's writes (None: plain writes)

    @property
    def host(self) -> str:
        return self.connection.host

    @property
    def port(self) -> int:
        return self.connection.port

    def client_settings(self) -> ClientSettings:
        # A producer drops an existing connection when another opens with the same name, so
        # every consumer (one per task and per driver call) gets a name of its own.
        return ClientSettings(
            self.connection,
            name=f"dcpkv-spark:{os.getpid()}:{uuid.uuid4().hex[:12]}",
            include_values=self.include_values,
        )

    def selected(self, available: Iterable[int]) -> list[int]:
        """The vbuckets to read: the ``vbuckets`` option, checked against the server's."""
        have = sorted(available)
        if not self.vbuckets:
            return have
        missing = sorted(set(self.vbuckets) - set(have))
        if missing:
            raise OptionError(f"vbuckets: the bucket has no vbucket {missing[0]}")
        return list(self.vbuckets)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Parse Spark's option map (keys compared case-insensitively)."""
    opts = {k.lower(): v for k, v in options.items()}
    nodes, tls = _nodes(opts)
    connection = ConnectionSettings(
        nodes,
        bucket=opts.get("bucket", DEFAULT_BUCKET),
        user=opts.get("user", DEFAULT_USER),
        password=opts.get("password", DEFAULT_PASSWORD),
        tls=_tls(opts, tls),
    )
    return SourceOptions(
        connection=connection,
        vbuckets=parse_vbuckets(opts.get("vbuckets", "")),
        starting=_offsets_option(opts.get("startingoffsets", "earliest"), "startingOffsets"),
        ending=_offsets_option(opts.get("endingoffsets", "latest"), "endingOffsets"),
        max_changes_per_trigger=_positive(opts, "maxchangespertrigger"),
        num_partitions=_positive(opts, "numpartitions"),
        include_values=_bool(opts.get("includevalues", "true"), "includeValues"),
        mode=_mode(opts.get("mode", "changes")),
        durability=_durability(opts),
    )


def _durability(opts: Mapping[str, str]) -> ServerDurability | None:
    try:
        level = parse_durability(opts.get("durability", "none"))
        timeout = _positive(opts, "durabilitytimeoutms")
        required = ServerDurability(level, None if timeout is None else timeout / 1000)
    except ValueError as exc:
        raise OptionError(f"durability: {exc}") from None
    return server_durability(required)


def parse_vbuckets(text: str) -> tuple[int, ...]:
    """``"0,1,5-9"`` -> ``(0, 1, 5, 6, 7, 8, 9)``; empty -> ``()`` (all)."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise OptionError(f"vbuckets: {part!r} is not a number or a range a-b") from None
        if not 0 <= first <= last <= 0xFFFF:
            raise OptionError(f"vbuckets: {part!r} is not a range of ids from 0 to 65535")
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def _nodes(opts: Mapping[str, str]) -> tuple[tuple[Node, ...], bool]:
    """The nodes, and whether their connection string asked for TLS (``couchbases://``)."""
    try:
        # ``connectionString`` is the SDKs' name for it; ``nodes`` takes one too
        tls, nodes = scheme_tls((opts.get("connectionstring") or opts.get("nodes", "")).strip())
        if nodes:
            return parse_nodes(nodes), tls
        port = parse_port(opts.get("port", str(DEFAULT_PORT)))
        return (Node(opts.get("host", DEFAULT_HOST), port),), False
    except NodeAddressError as exc:
        raise OptionError(str(exc)) from None


def _tls(opts: Mapping[str, str], from_scheme: bool) -> TlsSettings | None:
    if not (from_scheme or _bool(opts.get("tls", "false"), "tls")):
        return None
    return TlsSettings(
        ca=opts.get("tlsca"),
        verify=_bool(opts.get("tlsverify", "true"), "tlsVerify"),
        cert=opts.get("tlscert"),
        key=opts.get("tlskey"),
    )


def _positive(opts: Mapping[str, str], key: str) -> int | None:
    if key not in opts:
        return None
    try:
        value = int(opts[key])
    except ValueError:
        raise OptionError(f"{key}: {opts[key]!r} is not a number") from None
    if value < 1:
        raise OptionError(f"{key} must be at least 1, got {value}")
    return value


def _bool(text: str, what: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise OptionError(f"{what}: {text!r} is not true or false")


def _mode(text: str) -> str:
    if text.lower() not in MODES:
        raise OptionError(f"mode: {text!r} is not one of {', '.join(MODES)}")
    return text.lower()


def _offsets_option(text: str, what: str) -> str | SparkOffsets:
    if text.strip().lower() in ("earliest", "latest"):
        return text.strip().lower()
    try:
        return SparkOffsets.from_dict_json(text)
    except ValueError as exc:
        raise OptionError(f"{what}: {exc}") from None
