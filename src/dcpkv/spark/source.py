"""The ``dcpkv`` Spark format: a streaming and batch source over DCP, and a KV sink.

Theory of operation
-------------------
Spark's Python data source API runs :class:`DcpkvDataSource` in three places: on the driver
(planning: ``reader``/``streamReader``/``writer``, offsets, partitions), pickled into tasks
(``read``/``write``), and again on the driver to commit. So every planning decision is made on
the driver from the server's state and carried to the tasks inside the partitions; a task
only streams or writes what it was told.

Streaming (:class:`DcpkvStreamReader`). The offset is a :class:`SparkOffsets` (see
``sparkoffsets.py``); :meth:`~DcpkvStreamReader.latestOffset` asks the server for every
vbucket's uuid and high seqno (one Stat round trip, plus a failover log for each vbucket whose
branch moved) and plans the batch's end with ``plan.plan_end``, within the read limit Spark
passes (``maxChangesPerTrigger`` becomes the default :class:`ReadMaxRows`; Spark passes
:class:`ReadAllAvailable` when a trigger wants everything). Spark writes that end offset to
its offset log *before* the batch runs, so a restarted query re-runs the same batch from the
same offsets: reads are deterministic in their range, and the batch ends at the end seqnos
whatever happened to the connections meanwhile. ``Trigger.AvailableNow`` records the high
seqnos once (:meth:`~DcpkvStreamReader.prepareForTriggerAvailableNow`) and never plans past
them, so the query stops when it has caught up with the server as it was at the start.

Batch (:class:`DcpkvBatchReader`). ``mode=changes`` reads the changes between
``startingOffsets`` and ``endingOffsets`` like one micro-batch; ``mode=documents`` reads every
vbucket from 0 to the high seqnos seen while planning and keeps the last version of each key
(``read.document_rows``): one row per live document, consistent per vbucket at those seqnos.

Sink (:class:`DcpkvWriter`, :class:`DcpkvStreamWriter`). Each task writes its rows through a
pipelined :class:`~dcpkv.client.writer.KVWriter`; the vbucket count for routing keys is read
once on the driver. Rows with ``op`` deletion/expiration delete the key, rollback rows are
skipped, anything else upserts ``key``/``value``/``flags``/``expiry``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from dcpkv.client.settings import ConnectionSettings
from dcpkv.core.errors import DcpkvError
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.spark.columns import SCHEMA_DDL
from dcpkv.spark.link import DriverLink
from dcpkv.spark.options import OptionError, SourceOptions, parse_options
from dcpkv.spark.plan import (
    VbTarget,
    batch_end,
    branch_moved,
    initial_offsets,
    spread_by_node,
    targets,
)
from dcpkv.spark.sparkoffsets import SparkOffsets

# The client library, pyarrow and the read path are imported where they are used: Spark
# unpickles this module in several planner processes per query (the source's creation, the
# read's planning) that need none of them, and each paid ~0.2 s for them on a cold query.
if TYPE_CHECKING:
    import pyarrow as pa

    from dcpkv.client.durability import ServerDurability
    from dcpkv.client.writer import WriteOp

DELETE_OPS = frozenset({"deletion", "expiration", "delete"})


class SinkError(DcpkvError, ValueError):
    """A row the sink cannot write (no key, a value of the wrong type)."""


# -- talking to the server from the driver ---------------------------------------------------


def server_seqnos(opts: SourceOptions) -> dict[int, tuple[int, int]]:
    """vbucket -> (uuid, high seqno), one Stat round trip."""
    from dcpkv.client.sync import SyncConsumer

    with SyncConsumer(opts.client_settings()) as consumer:
        return consumer.vbucket_seqnos()


def failover_logs(
    opts: SourceOptions, vbuckets: Sequence[int]
) -> dict[int, tuple[FailoverEntry, ...]]:
    if not vbuckets:
        return {}
    from dcpkv.client.sync import SyncConsumer

    with SyncConsumer(opts.client_settings()) as consumer:
        return consumer.failover_logs(vbuckets)


class DcpkvPartition(InputPartition):
    """One task's share of a batch: vbuckets, each with its start position and end seqno."""

    def __init__(self, work: Sequence[VbTarget]) -> None:
        super().__init__(tuple(work))

    @property
    def work(self) -> tuple[VbTarget, ...]:
        return self.value


def active_nodes(opts: SourceOptions) -> dict[int, str]:
    """vbucket -> its active node, from the cluster map."""
    from dcpkv.client.sync import SyncConsumer

    with SyncConsumer(opts.client_settings()) as consumer:
        return consumer.active_nodes()


def _partitions(
    work: list[VbTarget], opts: SourceOptions, link: DriverLink | None = None
) -> list[DcpkvPartition]:
    """Tasks by node (``plan.spread_by_node``); one node's map is all of it on a single node."""
    if not work:
        node_of: dict[int, str] = {}
    elif link is not None:
        node_of = link.ask(lambda consumer: consumer.active_nodes())
    else:
        node_of = active_nodes(opts)
    return [DcpkvPartition(task) for task in spread_by_node(work, opts.num_partitions, node_of)]


# -- the data source -------------------------------------------------------------------------


class DcpkvDataSource(DataSource):
    """``format("dcpkv")``: see the module docstring and docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "dcpkv"

    def schema(self) -> str:
        return SCHEMA_DDL

    def _opts(self) -> SourceOptions:
        return parse_options(dict(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return DcpkvBatchReader(self._opts())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DcpkvStreamReader(self._opts())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return DcpkvWriter(*_sink_setup(self._opts(), schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return DcpkvStreamWriter(*_sink_setup(self._opts(), schema))


# -- streaming source ------------------------------------------------------------------------


class DcpkvStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: dict[int, int] | None = None  # AvailableNow: never plan past these
        self._initial: dict[str, Any] | None = None  # initialOffset's answer (it is asked twice)
        self._link = DriverLink(opts)

    def _seqnos(self) -> dict[int, tuple[int, int]]:
        return self._link.ask(lambda consumer: consumer.vbucket_seqnos())

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks twice per query (the first batch's planning, then its run). With
        # ``latest`` (or ``now``) each answer is the server's high seqnos of that moment, and
        # writes in between made the run start above where the plan did (past the planned end,
        # even): one answer per query, the first.
        if self._initial is None:
            seqnos = self._seqnos()
            vbs = self.opts.selected(seqnos)
            self._initial = initial_offsets(self.opts.starting, vbs, seqnos).to_dict()
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_changes_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {vb: high for vb, (_uuid, high) in self._seqnos().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        seqnos = {vb: self._capped(vb, uuid, high) for vb, (uuid, high) in self._seqnos().items()}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = batch_end(SparkOffsets.from_dict(start), seqnos, self._link.ask, budget)
        return end.to_dict()

    def _capped(self, vb: int, uuid: int, high: int) -> tuple[int, int]:
        if self._target is None or vb not in self._target:
            return uuid, high
        return uuid, min(high, self._target[vb])

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[DcpkvPartition]:
        work = targets(SparkOffsets.from_dict(start), SparkOffsets.from_dict(end))
        return _partitions(work, self.opts, self._link)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from dcpkv.spark.read import change_batches

        assert isinstance(partition, DcpkvPartition)
        config = self.opts.client_settings()
        return change_batches(config, partition.work, self.opts.include_values)

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to release: the server keeps no state for us between batches.
        pass

    def stop(self) -> None:
        self._link.close()


# -- batch source ----------------------------------------------------------------------------


class DcpkvBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        seqnos = server_seqnos(opts)
        vbs = opts.selected(seqnos)
        if opts.mode == "documents":
            begin = SparkOffsets.earliest(vbs)
            ends = {vb: seqnos[vb][1] for vb in vbs}
        else:
            begin = initial_offsets(opts.starting, vbs, seqnos)
            ends = _ending(opts.ending, vbs, seqnos)
        # A vbucket whose branch moved is read even with nothing new (or a high seqno below
        # its start): the stream request is what reveals its rollback, news for downstream.
        self.work = [
            VbTarget(vb, begin[vb], ends[vb], max(0, ends[vb] - begin[vb].offset.seqno))
            for vb in vbs
            if ends[vb] > begin[vb].offset.seqno or branch_moved(begin[vb], seqnos[vb][0])
        ]

    def partitions(self) -> list[DcpkvPartition]:
        # Nothing to read still needs one (empty) task: given no partitions, Spark runs one
        # task with a partition of its own making.
        return _partitions(self.work, self.opts) or [DcpkvPartition(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from dcpkv.spark.read import change_batches, document_batches

        assert isinstance(partition, DcpkvPartition)
        config = self.opts.client_settings()
        values = self.opts.include_values
        if self.opts.mode == "documents":
            return document_batches(config, partition.work, values)
        return change_batches(config, partition.work, values)


def _ending(
    ending: str | SparkOffsets, vbs: Sequence[int], seqnos: Mapping[int, tuple[int, int]]
) -> dict[int, int]:
    if isinstance(ending, SparkOffsets):
        missing = [vb for vb in vbs if vb not in ending]
        if missing:
            raise OptionError(f"endingOffsets: no offset for vbucket {missing[0]}")
        return {vb: ending[vb].offset.seqno for vb in vbs}
    if ending != "latest":
        raise OptionError("endingOffsets must be latest or offsets")
    return {vb: seqnos[vb][1] for vb in vbs}


# -- sink ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DcpkvCommit(WriterCommitMessage):
    written: int


def _sink_setup(
    opts: SourceOptions, schema: StructType
) -> tuple[ConnectionSettings, int, tuple[str, ...], ServerDurability | None]:
    columns = tuple(schema.fieldNames())
    if "key" not in columns:
        raise SinkError(f"the dcpkv sink needs a key column; the DataFrame has {list(columns)}")
    return opts.connection, len(server_seqnos(opts)), columns, opts.durability


def row_op(row: Any, columns: tuple[str, ...]) -> WriteOp | None:
    """The write for a row, or None for a rollback row (a target cannot undo; see docs/spark.md)."""
    from dcpkv.client.writer import WriteOp

    get = row.asDict() if hasattr(row, "asDict") else dict(zip(columns, row, strict=True))
    op = (get.get("op") or "mutation").lower()
    if op == "rollback":
        return None
    key = _bytes(get.get("key"), "key")
    if not key:
        raise SinkError(f"a row without a key cannot be written: {get}")
    if op in DELETE_OPS:
        return WriteOp(key, delete=True)
    return WriteOp(
        key,
        value=_bytes(get.get("value"), "value"),
        flags=int(get.get("flags") or 0),
        expiry=int(get.get("expiry") or 0),
    )


def _bytes(value: Any, what: str) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise SinkError(f"{what} must be binary or a string, got {type(value).__name__}")


class _SinkTask:
    def __init__(
        self,
        connection: ConnectionSettings,
        num_vbuckets: int,
        columns: tuple[str, ...],
        durability: ServerDurability | None = None,
    ) -> None:
        self.connection = connection
        self.num_vbuckets = num_vbuckets
        self.columns = columns
        self.durability = durability

    def write(self, iterator: Iterator[Any]) -> DcpkvCommit:
        from dcpkv.client.writer import KVWriter

        ops = (op for op in (row_op(r, self.columns) for r in iterator) if op is not None)
        with KVWriter(self.connection, self.num_vbuckets, durability=self.durability) as writer:
            return DcpkvCommit(writer.write(ops))


class DcpkvWriter(_SinkTask, DataSourceWriter):
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # every task's writes are already applied: KV writes are not transactional

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class DcpkvStreamWriter(_SinkTask, DataSourceStreamWriter):
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
