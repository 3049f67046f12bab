"""Shared test data for the protocol tests: one example per message type, and hypothesis
strategies that cover every field over its full wire range.

Strategies are derived from each type's layout tables (a ``struct`` format says the width of
every extras field), so adding a message type with a declarative layout needs no new test
code; variable layouts get an explicit entry in ``_OVERRIDES``.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

from hypothesis import strategies as st

from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol import dcp, kv
from dcpkv.protocol.base import GenericResponse, Message, Part, Request, Response
from dcpkv.protocol.constants import HelloFeature, Opcode, OpenFlag, SnapshotFlag, StreamEndReason

U8 = st.integers(0, 0xFF)
U16 = st.integers(0, 0xFFFF)
U32 = st.integers(0, 0xFFFF_FFFF)
U64 = st.integers(0, (1 << 64) - 1)
# edges first: hypothesis finds them anyway, but this makes every run hit them
U64_EDGY = st.one_of(st.sampled_from([0, 1, (1 << 63), (1 << 64) - 1]), U64)
_WIDTH = {"B": U8, "H": U16, "I": U32, "Q": U64_EDGY}

ALL_TYPES: tuple[type[Message], ...] = (
    *kv.REQUEST_TYPES,
    *kv.SERVER_REQUEST_TYPES,
    *kv.RESPONSE_TYPES,
    *dcp.REQUEST_TYPES,
    dcp.SnapshotMarkerV2_0,
    dcp.SnapshotMarkerV2_2,
    dcp.DeletionV2,
    *dcp.RESPONSE_TYPES,
    GenericResponse,
)


def _struct_fields(layout: struct.Struct | None, names: tuple[str, ...]) -> dict[str, Any]:
    if layout is None:
        return {}
    codes = layout.format.lstrip(">")
    return {n: _WIDTH[c] for n, c in zip(names, codes, strict=True) if not n.startswith("_")}


def _bytes_part(part: Part, text: bool, max_bytes: int) -> st.SearchStrategy[Any]:
    min_size = 1 if part is Part.REQUIRED else 0
    if text:
        # at most 4 UTF-8 bytes a character keeps the encoding within max_bytes
        return st.text(min_size=min_size, max_size=max_bytes // 4)
    return st.binary(min_size=min_size, max_size=max_bytes)


_FAILOVER = st.lists(st.builds(FailoverEntry, U64_EDGY, U64_EDGY), min_size=1, max_size=30).map(
    tuple
)
_SEQNO_EXTRAS = st.one_of(
    st.just({"vbucket_uuid": None, "seqno": None}),
    st.fixed_dictionaries({"vbucket_uuid": U64_EDGY, "seqno": U64_EDGY}),
)
_MARKER_FLAGS = st.one_of(st.sampled_from(list(SnapshotFlag)), U32)
_OVERRIDES: dict[type[Message], dict[str, st.SearchStrategy[Any]]] = {
    kv.Hello: {"features": st.lists(U16, max_size=20).map(tuple)},
    kv.HelloResponse: {"features": st.lists(U16, max_size=20).map(tuple)},
    kv.SetVbucket: {"state": st.sampled_from(list(VBucketState)), "meta": st.binary(max_size=40)},
    kv.GetVbucketResponse: {"state": st.sampled_from(list(VBucketState))},
    kv.GetAllVbSeqnos: {"state": st.none() | st.sampled_from(list(VBucketState))},
    kv.GetAllVbSeqnosResponse: {
        "seqnos": st.lists(st.tuples(U16, U64_EDGY), max_size=50).map(tuple)
    },
    kv.ObserveSeqnoResponse: {
        "vbucket": U16,
        "vbucket_uuid": U64_EDGY,
        "last_persisted_seqno": U64_EDGY,
        "current_seqno": U64_EDGY,
    },
    kv.GetMeta: {"version": st.sampled_from([1, 2])},
    kv.GetqMeta: {"version": st.sampled_from([1, 2])},
    **{
        t: {
            "flags": U32,
            "expiration": U32,
            "rev_seqno": U64_EDGY,
            "meta_cas": U64_EDGY,
            "options": st.none() | U32,
            "nmeta": st.none() | U16,
        }
        for t in kv.WITH_META_TYPES
    },
    kv.GetqMetaResponse: {
        "deleted": st.booleans(),
        "flags": U32,
        "expiry": U32,
        "rev_seqno": U64_EDGY,
        "item_datatype": st.none() | U8,
    },
    kv.GetMetaResponse: {
        "deleted": st.booleans(),
        "flags": U32,
        "expiry": U32,
        "rev_seqno": U64_EDGY,
        "item_datatype": st.none() | U8,
    },
    dcp.SetVbucketState: {"state": st.sampled_from(list(VBucketState))},
    dcp.StreamEnd: {"reason": st.one_of(st.sampled_from(list(StreamEndReason)), U32)},
    dcp.StreamRequest: {
        "value": st.one_of(st.just(b""), st.builds(dcp.stream_request_value, U64_EDGY))
    },
    dcp.StreamRequestOk: {"failover_log": _FAILOVER},
    dcp.GetFailoverLogResponse: {"failover_log": _FAILOVER},
    dcp.DcpOpen: {"flags": st.one_of(st.sampled_from(list(OpenFlag)), U32)},
    dcp.DcpBarrier: {"echo": st.booleans()},
    # a server request (magic 0x82) has no flex twin to carry framing extras
    kv.ClustermapChangeNotification: {
        "epoch": U64_EDGY,
        "rev": U64_EDGY,
        "stream_id": st.none(),
    },
    dcp.SnapshotMarker: {"flags": _MARKER_FLAGS},
    dcp.SnapshotMarkerV2_0: {"flags": _MARKER_FLAGS},
    dcp.SnapshotMarkerV2_2: {"flags": _MARKER_FLAGS},
    GenericResponse: {
        "opcode": U8,
        "to_server": st.booleans(),
        "extras": st.binary(max_size=40),
        "key": st.binary(max_size=250),
        "value": st.binary(max_size=300),
    },
}


def _header(cls: type[Message]) -> dict[str, st.SearchStrategy[Any]]:
    fields: dict[str, st.SearchStrategy[Any]] = {
        "opaque": U32,
        "cas": U64_EDGY,
        "datatype": U8,
    }
    if issubclass(cls, Request):
        fields["vbucket"] = U16
        fields["stream_id"] = st.none() | U16
    if issubclass(cls, Response):
        if cls is GenericResponse:
            fields["status"] = U16
        else:
            fields["status"] = st.sampled_from(sorted(cls.STATUSES))
    return fields


def strategy_for(cls: type[Message]) -> st.SearchStrategy[Message]:
    fields = _header(cls)
    if cls.KEY and cls is not GenericResponse:
        limit = 200 if cls is dcp.DcpOpen else 250
        fields[cls.KEY_FIELD] = _bytes_part(cls.KEY, cls.KEY_TEXT, limit)
    if cls.VALUE and cls is not GenericResponse:
        fields[cls.VALUE_FIELD] = _bytes_part(cls.VALUE, cls.VALUE_TEXT, 400)
    fields.update(_struct_fields(cls.EXTRAS, cls.EXTRAS_FIELDS))
    fields.update(_struct_fields(cls.VALUE_STRUCT, cls.VALUE_FIELDS))
    if issubclass(cls, dcp.SnapshotMarkerV2_0):
        fields.update(_struct_fields(cls.VALUE_LAYOUT, cls.VALUE_NAMES))
    if cls in (kv.MutationResponse, kv.IncrementResponse) or issubclass(
        cls, kv.MutationResponse | kv.IncrementResponse
    ):
        fields["_seqno"] = _SEQNO_EXTRAS
    if cls is kv.IncrementResponse or issubclass(cls, kv.IncrementResponse):
        fields["counter"] = U64_EDGY
    if cls is kv.ObserveSeqnoResponse:
        fields["_observe"] = st.one_of(
            st.just({"old_vbucket_uuid": None, "last_received_seqno": None}),
            st.fixed_dictionaries({"old_vbucket_uuid": U64_EDGY, "last_received_seqno": U64}),
        )
    fields.update(_OVERRIDES.get(cls, {}))
    names = {f.name for f in dataclasses.fields(cls)}
    for name in fields:
        assert name.startswith("_") or name in names, f"{cls.__name__} has no field {name}"
    if cls is dcp.DcpBarrier:
        # an echoed barrier (magic 0x82) cannot carry a stream id in framing extras
        return st.fixed_dictionaries(fields).map(_barrier)
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**_flatten(kw)))


def _flatten(kw: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in kw.items() if not k.startswith("_")}
    for k, v in kw.items():
        if k.startswith("_"):
            out.update(v)
    return out


def _barrier(kw: dict[str, Any]) -> dcp.DcpBarrier:
    if kw["echo"]:
        kw["stream_id"] = None
    return dcp.DcpBarrier(**kw)


def _fl(*pairs: tuple[int, int]) -> tuple[FailoverEntry, ...]:
    return tuple(FailoverEntry(u, s) for u, s in pairs)


MAX64 = (1 << 64) - 1

# One hand-written instance per type, with non-default values wherever the type allows.
EXAMPLES: list[Message] = [
    kv.Get(key=b"doc-1", opaque=1, vbucket=12),
    kv.GetQ(key=b"doc-1", opaque=2),
    kv.GetK(key=b"doc-1", opaque=3),
    kv.GetKQ(key=b"doc-1", opaque=4),
    kv.Set(key=b"k", value=b'{"a":1}', flags=0x02000000, expiration=60, datatype=1, cas=9),
    kv.SetQ(key=b"k", value=b"v", flags=1, expiration=2),
    kv.Add(key=b"k", value=b"v", flags=3),
    kv.AddQ(key=b"k", value=b"v", expiration=4),
    kv.Replace(key=b"k", value=b"v", cas=MAX64),
    kv.ReplaceQ(key=b"k", value=b"", flags=5),
    kv.Delete(key=b"gone", vbucket=1023),
    kv.DeleteQ(key=b"gone"),
    kv.Append(key=b"k", value=b"tail"),
    kv.Prepend(key=b"k", value=b"head"),
    kv.Touch(key=b"k", expiration=300),
    kv.GAT(key=b"k", expiration=301),
    kv.Increment(key=b"ctr", delta=MAX64, initial=7, expiration=9),
    kv.Decrement(key=b"ctr", delta=1, initial=MAX64, expiration=0xFFFFFFFF),
    kv.Quit(opaque=5),
    kv.Flush(),
    kv.Noop(opaque=6),
    kv.Version(),
    kv.Stat(group="vbucket-seqno"),
    kv.Hello(agent='{"a":"python"}', features=(HelloFeature.Xerror, HelloFeature.Collections)),
    kv.SaslListMechs(),
    kv.SaslAuth(mechanism="PLAIN", data=b"\0user\0password"),
    kv.SaslStep(mechanism="SCRAM-SHA512", data=b"c=biws,r=abc"),
    kv.SelectBucket(bucket="default"),
    kv.SetVbucket(state=VBucketState.REPLICA, vbucket=3),
    kv.GetVbucket(vbucket=3),
    kv.DelVbucket(vbucket=3),
    kv.GetAllVbSeqnos(),
    kv.GetAllVbSeqnos(state=VBucketState.ACTIVE),
    kv.ObserveSeqno(vbucket=2, vbucket_uuid=MAX64),
    kv.GetMeta(key=b"doc-1", vbucket=4),
    kv.GetMeta(key=b"doc-1", version=2),
    kv.GetqMeta(key=b"doc-1", version=2),
    kv.SetWithMeta(key=b"k", value=b"v", flags=1, expiration=2, rev_seqno=MAX64, meta_cas=9),
    kv.SetqWithMeta(key=b"k", value=b"v", rev_seqno=3, meta_cas=4, options=0x08),
    kv.AddWithMeta(key=b"k", value=b"v", rev_seqno=3, meta_cas=4, nmeta=0),
    kv.AddqWithMeta(key=b"k", rev_seqno=3, meta_cas=MAX64, options=0x0C, nmeta=2),
    kv.DelWithMeta(key=b"k", expiration=1700000000, rev_seqno=3, meta_cas=4),
    kv.DelqWithMeta(key=b"k", rev_seqno=3, meta_cas=4, options=0x10),
    kv.SeqnoPersistence(vbucket=2, seqno=MAX64),
    kv.SeqnoPersistence(vbucket=3, seqno=7, vbucket_uuid=MAX64),
    kv.GetClusterConfig(),
    kv.SetClusterConfig(bucket="default", config=b'{"rev":7}'),
    kv.RbacRefresh(users=b'{"rev":1,"users":{}}'),
    kv.GetErrorMap(version=2),
    kv.GetResponse(flags=0x02000000, value=b"{}", cas=77),
    kv.GetQResponse(flags=1, value=b"x"),
    kv.GetKResponse(flags=1, key=b"doc-1", value=b"x"),
    kv.GetKQResponse(flags=2, key=b"doc-1", value=b"y"),
    kv.GATResponse(flags=3, value=b"z"),
    kv.MutationResponse(cas=5),
    kv.MutationResponse(cas=5, vbucket_uuid=MAX64, seqno=MAX64),
    kv.SetQResponse(vbucket_uuid=1, seqno=2),
    kv.AddResponse(),
    kv.AddQResponse(),
    kv.ReplaceResponse(),
    kv.ReplaceQResponse(),
    kv.DeleteResponse(vbucket_uuid=3, seqno=4),
    kv.DeleteQResponse(),
    kv.AppendResponse(),
    kv.PrependResponse(),
    kv.TouchResponse(),
    kv.IncrementResponse(counter=MAX64),
    kv.DecrementResponse(counter=0, vbucket_uuid=8, seqno=9),
    kv.VersionResponse(version="7.6.0-dcpkv"),
    kv.StatResponse(name="vb_0:high_seqno", value="42"),
    kv.StatResponse(),
    kv.HelloResponse(features=(HelloFeature.Xerror, 0x7FFF)),
    kv.SaslListMechsResponse(mechanisms="SCRAM-SHA512 PLAIN"),
    kv.SaslAuthResponse(status=Status.AuthContinue, data=b"r=abc,s=salt,i=4096"),
    kv.SaslStepResponse(data=b"v=proof"),
    kv.GetVbucketResponse(state=VBucketState.DEAD),
    kv.GetAllVbSeqnosResponse(seqnos=((0, 5), (1023, MAX64))),
    kv.ObserveSeqnoResponse(vbucket=1, vbucket_uuid=2, last_persisted_seqno=3, current_seqno=4),
    kv.ObserveSeqnoResponse(
        vbucket=1,
        vbucket_uuid=2,
        last_persisted_seqno=3,
        current_seqno=4,
        old_vbucket_uuid=5,
        last_received_seqno=MAX64,
    ),
    kv.GetMetaResponse(cas=7, deleted=True, flags=1, expiry=2, rev_seqno=MAX64),
    kv.GetMetaResponse(cas=7, rev_seqno=3, item_datatype=1),
    kv.GetqMetaResponse(cas=8, rev_seqno=4),
    kv.SetWithMetaResponse(cas=5, vbucket_uuid=1, seqno=2),
    kv.SetqWithMetaResponse(),
    kv.AddWithMetaResponse(cas=6),
    kv.AddqWithMetaResponse(),
    kv.DelWithMetaResponse(cas=7, vbucket_uuid=3, seqno=4),
    kv.DelqWithMetaResponse(),
    kv.GetClusterConfigResponse(config=b'{"rev":1}'),
    kv.GetErrorMapResponse(error_map=b'{"version":2}'),
    kv.ClustermapChangeNotification(
        bucket="default", epoch=1, rev=MAX64, config=b'{"rev":1}', datatype=1
    ),
    dcp.DcpOpen(name="replication:a->b", flags=OpenFlag.Producer | OpenFlag.IncludeXattrs),
    dcp.DcpOpen(name="c", value=b'{"consumer_name":"x"}'),
    dcp.DcpControl(key="connection_buffer_size", value="1048576"),
    dcp.DcpNoop(opaque=99),
    dcp.BufferAck(bytes_acked=0xFFFFFFFF),
    dcp.DcpBarrier(cookie=b"cookie-1", opaque=12),
    dcp.DcpBarrier(cookie=b"cookie-1", opaque=12, echo=True),
    dcp.AddStream(flags=1, vbucket=7),
    dcp.AddStreamResponse(stream_opaque=0xCAFE),
    dcp.CloseStream(vbucket=7, stream_id=3),
    dcp.StreamRequest(
        vbucket=7,
        opaque=0xABCD,
        flags=0x20,
        start_seqno=MAX64,
        end_seqno=MAX64,
        vbucket_uuid=MAX64,
        snap_start_seqno=MAX64 - 1,
        snap_end_seqno=MAX64,
        value=dcp.stream_request_value(purge_seqno=123),
    ),
    dcp.StreamRequestOk(failover_log=_fl((MAX64, 10), (1, 0))),
    dcp.StreamRequestRollback(rollback_seqno=MAX64),
    dcp.GetFailoverLog(vbucket=7),
    dcp.GetFailoverLogResponse(failover_log=_fl((5, 0))),
    dcp.StreamEnd(reason=StreamEndReason.Rollback, vbucket=7),
    dcp.StreamEnd(reason=0xFFFF_FFFF),
    dcp.SetVbucketState(state=VBucketState.PENDING),
    dcp.SnapshotMarker(start_seqno=1, end_seqno=MAX64, flags=SnapshotFlag.Disk),
    dcp.SnapshotMarkerV2_0(
        start_seqno=1, end_seqno=8, flags=2, max_visible_seqno=8, high_completed_seqno=7
    ),
    dcp.SnapshotMarkerV2_2(
        start_seqno=1,
        end_seqno=8,
        flags=2,
        max_visible_seqno=8,
        high_completed_seqno=7,
        purge_seqno=MAX64,
        high_prepared_seqno=6,
    ),
    dcp.Mutation(key=b"k" * 16, value=b"v" * 100, by_seqno=MAX64, rev_seqno=2, flags=3),
    dcp.Mutation(key=b"k", by_seqno=1, expiration=4, lock_time=5, nmeta=6, nru=7, stream_id=9),
    dcp.Deletion(key=b"k", by_seqno=3, rev_seqno=4, nmeta=0),
    dcp.DeletionV2(key=b"k", value=b"xattrs", by_seqno=3, rev_seqno=4, delete_time=1700000000),
    dcp.Expiration(key=b"k", by_seqno=MAX64, rev_seqno=1, delete_time=5),
    dcp.SystemEvent(by_seqno=1, event=0, version=2, key=b"collection", value=b"\x00\x01"),
    dcp.SeqnoAdvanced(by_seqno=MAX64),
    dcp.OsoSnapshot(flags=1),
    dcp.Prepare(key=b"k", value=b"v", by_seqno=2, durability_level=3, deleted=1),
    dcp.SeqnoAcknowledged(prepared_seqno=MAX64),
    dcp.Commit(key=b"k", prepared_seqno=1, commit_seqno=2),
    dcp.Abort(key=b"k", prepared_seqno=1, abort_seqno=2),
    GenericResponse(opcode=Opcode.Noop),
    GenericResponse(opcode=Opcode.Get, status=Status.KeyEnoent, key=b"doc-1", value=b"Not found"),
    GenericResponse(opcode=Opcode.DcpStreamRequest, status=Status.Erange),
    GenericResponse(opcode=Opcode.Set, status=Status.NotMyVbucket, value=b'{"rev":3}'),
    GenericResponse(opcode=0xEE, status=0x7777, to_server=True, extras=b"\x01\x02"),
]
