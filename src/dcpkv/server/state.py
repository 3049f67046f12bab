"""What every connection of one server shares: settings, users, buckets, the cluster map.

The map a node *serves* (GetClusterConfig, NotMyVbucket answers, ClustermapChangeNotification)
is the newest of the map the manager pushed for good and a staged map adopted at a handover
(:mod:`dcpkv.server.handover`); replication follows the pushed one only. Connections that asked
Hello for Duplex and ClustermapChangeNotification are sent every newer map of their bucket the
moment it is served.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcpkv.core.files import atomic_write
from dcpkv.core.manager_term import TermFence
from dcpkv.core.rbac import USERS_FILE
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol import kv
from dcpkv.protocol.constants import Datatype, HelloFeature
from dcpkv.server.auth import UserStore
from dcpkv.server.cluster_map import PushedConfig, cluster_map, cluster_map_json
from dcpkv.server.config import ServerSettings
from dcpkv.server.handover import Handovers, StagedMap, parse_push
from dcpkv.server.latency import LatencyHistogram
from dcpkv.server.login_throttle import LoginThrottle

CLUSTER_CONFIG_SUFFIX = ".cluster-config.json"  # <data dir>/<bucket><suffix>: the last map kept
TERM_FILE = "manager-term"  # <data dir>/manager-term: the newest manager term a managed node saw


@dataclass
class ServerState:
    config: ServerSettings
    buckets: dict[str, Any] = field(default_factory=dict)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("dcpkv.server"))
    # The port actually bound (the config may ask for 0, "any free port").
    port: int | None = None
    tls_port: int | None = None  # the TLS port actually bound, when TLS is on
    cluster_rev: int = 1
    connections: int = 0  # open client connections (the shell keeps it current)
    rejected_conns: int = 0  # refused at accept: max_connections reached
    unauth_timeouts: int = 0  # closed for not logging in within unauth_idle_timeout_s
    write_holds: int = 0  # connections held for their bucket's flush lag (write backpressure)
    bg_fetch_waits: int = 0  # requests that waited for a background fetch (server/app.py)
    # (bucket, DCP connection name) -> the Connection that opened it as a producer
    dcp_producers: dict[tuple[str, str], Any] = field(default_factory=dict)
    # bucket -> the newest map a cluster manager pushed (SetClusterConfig)
    cluster_configs: dict[str, PushedConfig] = field(default_factory=dict)
    # the newest manager term a connection named (dcpkv.core.manager_term)
    term_fence: TermFence = field(default_factory=TermFence)
    # bucket -> the map served: the pushed one or a newer staged one adopted at a handover
    served_configs: dict[str, PushedConfig] = field(default_factory=dict)
    # bucket -> its staged maps and handover times (dcpkv.server.handover)
    handovers: dict[str, Handovers] = field(default_factory=dict)
    # id -> the connections to send every newer map (Hello ClustermapChangeNotification)
    map_subscribers: dict[int, Any] = field(default_factory=dict)
    _map_writer: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    # called with a bucket's name when a newer map was kept (the replicators follow it)
    config_listeners: list[Callable[[str], None]] = field(default_factory=list)
    # bucket -> its Replicator on a managed node (dcpkv.server.replication), for stats
    replicators: dict[str, Any] = field(default_factory=dict)
    # failed logins per source address (dcpkv.server.login_throttle)
    login_throttle: LoginThrottle = field(default_factory=LoginThrottle)
    auth_errors: int = 0  # failed logins (stat auth_errors)
    eaccess: int = 0  # requests refused for want of a role (stat rbac_eaccess)
    # SeqnoPersistence requests waiting for the flusher (dcpkv.server.seqno_persistence)
    persistence_waiters: list[Any] = field(default_factory=list)
    # Requests received, by opcode, on both paths (the metric kv_ops: dcpkv.server.metrics)
    ops: list[int] = field(default_factory=lambda: [0] * 256)
    # The time to answer each read, while metrics are served (dcpkv.server.latency)
    latency: LatencyHistogram | None = None
    metrics_port: int | None = None  # the Prometheus port bound (--metrics-port), when on
    # bucket -> its SyncWrites [accepted as prepares, committed, aborted or ambiguous]
    sync_writes: dict[str, list[int]] = field(default_factory=dict)
    # durability level -> the time from prepare to commit of the SyncWrites that committed
    sync_write_durations: dict[str, LatencyHistogram] = field(default_factory=dict)

    def sync_duration(self, level: str) -> LatencyHistogram:
        histogram = self.sync_write_durations.get(level)
        if histogram is None:
            histogram = self.sync_write_durations[level] = LatencyHistogram()
        return histogram

    def sync_counts(self, bucket: str) -> list[int]:
        counts = self.sync_writes.get(bucket)
        if counts is None:
            counts = self.sync_writes[bucket] = [0, 0, 0]
        return counts

    def __post_init__(self) -> None:
        self.users = UserStore(dict(self.config.users), path=self.config.data_dir / USERS_FILE)

    @property
    def cluster_name(self) -> str | None:
        """The name the manager's map gives this node (``thisNode``), once one was pushed:
        what topologies and replicas call it, which may differ from the address it binds (a
        proxy, NAT or ``0.0.0.0`` in front of it)."""
        for pushed in self.cluster_configs.values():
            if pushed.this_node is not None:
                return pushed.this_node
        return None

    @property
    def node_name(self) -> str:
        """This node's name as a replica's DCP ``consumer_name`` (server/sync_writes.py): its
        :attr:`cluster_name`, else ``host:port`` as configured and bound."""
        return self.cluster_name or f"{self.config.host}:{self.port}"

    def set_cluster_config(self, bucket: str, config: bytes) -> bool:
        """Keep ``config`` (a manager's map) for ``bucket`` if it is newer than the one held;
        whether it was. ValueError when it is not a config (no integer ``rev``...). A kept map
        is served at once, then written beside the data, so a node restarted while the manager
        is away still serves its cluster's map (and its replicas stream) instead of a map of
        "nobody".
        A staged map (``dcpkv.adoptWhen``) is only kept for its handover, if newer than the
        map served; served at once if a vbucket it waits for changed hands already (a
        handover that ended while the manager staged it again)."""
        pushed, when = parse_push(config)
        if when is not None:
            return self._stage(bucket, pushed, when)
        held = self.cluster_configs.get(bucket)
        if held is not None and pushed.version <= held.version:
            if pushed.version[0] < held.version[0]:  # a deposed manager's late command
                self.log.warning(
                    "bucket %s: refused a map of an older manager term (revEpoch %d, rev %d; "
                    "holding revEpoch %d, rev %d)", bucket, *pushed.version, *held.version,
                )  # fmt: skip
            return False
        self.cluster_configs[bucket] = pushed
        self._serve(bucket, pushed)
        for listener in list(self.config_listeners):
            listener(bucket)
        self._keep(bucket, pushed.raw)
        return True

    def _stage(self, bucket: str, staged: PushedConfig, when: dict[int, VBucketState]) -> bool:
        served = self.served_configs.get(bucket)
        if served is not None and staged.version <= served.version:
            return False
        self.handover(bucket).stage(StagedMap(staged, when))
        vbuckets = self.buckets[bucket].vbuckets
        if any(vb in vbuckets and vbuckets[vb].state is s for vb, s in when.items()):
            self._serve(bucket, staged)
        return True

    def _keep(self, bucket: str, raw: bytes) -> None:
        """Write a kept map beside the data, in a thread of its own: an fsync took up to 0.2 s
        here under load, and a rebalance pushes maps back to back; nobody should wait for it
        (the manager pushes again a node that restarted without it). One thread: in order."""
        if self._map_writer is None:
            self._map_writer = ThreadPoolExecutor(1, thread_name_prefix="dcpkv-map")
        path = self._config_path(bucket)
        done = self._map_writer.submit(atomic_write, path, raw, path.with_name(f".{path.name}.tmp"))
        done.add_done_callback(self._kept)

    def _kept(self, done: Future[None]) -> None:
        if (exc := done.exception()) is not None:
            self.log.warning("the cluster map could not be written: %s", exc)

    def vbucket_state_changed(self, bucket: str, vb: int) -> None:
        """A state listener of every bucket (on the loop): a handover may make a staged map
        the one served (:mod:`dcpkv.server.handover`)."""
        vbucket = self.buckets[bucket].vbuckets.get(vb)
        state = vbucket.state if vbucket is not None else None
        served = self.served_configs.get(bucket)
        adopted = self.handover(bucket).state_changed(vb, state, served, time.monotonic())
        if adopted is not None:
            self._serve(bucket, adopted)

    def handover(self, bucket: str) -> Handovers:
        handovers = self.handovers.get(bucket)
        if handovers is None:
            handovers = self.handovers[bucket] = Handovers()
        return handovers

    def _serve(self, bucket: str, config: PushedConfig, *, notify: bool = True) -> None:
        served = self.served_configs.get(bucket)
        if served is not None and config.version <= served.version:
            return
        self.served_configs[bucket] = config
        self.handover(bucket).serving(config, time.monotonic())
        if notify:
            self._notify(bucket, config)

    def _notify(self, bucket: str, config: PushedConfig) -> None:
        """ClustermapChangeNotification to every subscriber in ``bucket``."""
        epoch, rev = config.version
        frames: dict[bool, bytes] = {}
        for conn in list(self.map_subscribers.values()):
            if conn.bucket_name != bucket or conn.user is None:
                continue
            json_ok = HelloFeature.JSON in conn.features
            if json_ok not in frames:
                frames[json_ok] = kv.ClustermapChangeNotification(
                    bucket=bucket, epoch=epoch, rev=rev, config=config.raw,
                    datatype=Datatype.JSON if json_ok else Datatype.Raw,
                ).encode()  # fmt: skip
            conn.send(frames[json_ok])

    def load_cluster_configs(self) -> None:
        """The maps kept before a restart (a managed node): a file that does not parse is
        left out with a warning, the manager's next push replaces it."""
        for name in [b.name for b in self.config.buckets]:
            path = self._config_path(name)
            try:
                self.cluster_configs[name] = PushedConfig.parse(path.read_bytes())
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                self.log.warning("%s: the last cluster map kept is unreadable (%s)", path, exc)
                continue
            self._serve(name, self.cluster_configs[name], notify=False)

    def saw_term(self, term: int) -> None:
        """A connection named manager ``term`` (its Hello): a newer term raises the fence and,
        on a managed node, is written down before the Hello is answered (a fence a crash
        could forget would let a deposed leader back in; a new term comes once a leader)."""
        if self.term_fence.saw(term) and self.config.managed:
            path = self.config.data_dir / TERM_FILE
            try:
                atomic_write(path, b"%d\n" % term, path.with_name(f".{TERM_FILE}.tmp"))
            except OSError as exc:  # (the fence holds in memory still)
                self.log.warning("manager term %d could not be written: %s", term, exc)

    def load_term_fence(self) -> None:
        """The newest manager term seen before a restart (a managed node); an unreadable file
        is left out with a warning (the next leader's Hello raises the fence again)."""
        path = self.config.data_dir / TERM_FILE
        try:
            self.term_fence.saw(int(path.read_text()))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self.log.warning("%s: the manager term kept is unreadable (%s)", path, exc)

    def _config_path(self, bucket: str) -> Path:
        return self.config.data_dir / f"{bucket}{CLUSTER_CONFIG_SUFFIX}"

    def pushed_config(self, bucket: str) -> bytes | None:
        pushed = self.cluster_configs.get(bucket)
        return pushed.raw if pushed is not None else None

    def cluster_map(self, bucket: str | None) -> bytes:
        name = bucket or self.config.buckets[0].name
        served = self.served_configs.get(name)
        if served is not None:
            return served.raw
        bucket_config = self.config.bucket(name)
        num_vbuckets = bucket_config.num_vbuckets if bucket_config else 1024
        doc = cluster_map(
            bucket=name,
            host=self.config.host,
            port=self.port if self.port is not None else self.config.port,
            num_vbuckets=num_vbuckets,
            rev=self.cluster_rev,
            tls_port=self.tls_port,
            vbucket_map=self._own_vbucket_map(name, num_vbuckets),
        )
        return cluster_map_json(doc)

    def _own_vbucket_map(self, name: str, num_vbuckets: int) -> list[list[int]]:
        """Until a manager pushes a map: this node (index 0) for the vbuckets it holds
        active, -1 ("nobody") for the rest (a managed node before its first map)."""
        bucket = self.buckets.get(name)
        vbuckets = getattr(bucket, "vbuckets", {})
        return [
            [0] if (vb := vbuckets.get(i)) is not None and vb.state == VBucketState.ACTIVE else [-1]
            for i in range(num_vbuckets)
        ]
