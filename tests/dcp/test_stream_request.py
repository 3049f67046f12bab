"""The order of checks on a stream request (PROTOCOL.md), one row per rule."""

from __future__ import annotations

import pytest

from dcpkv.core.failover_table import FailoverEntry, FailoverTable
from dcpkv.core.rollback import REASON_NO_COMMON_HISTORY, reason_ahead, reason_purged
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.stream_request import (
    Accept,
    Refuse,
    RollbackTo,
    StreamRequest,
    VBucketView,
    decide_stream_request,
)
from dcpkv.protocol.constants import StreamRequestFlag as F

TABLE = FailoverTable([FailoverEntry(2222, 3), FailoverEntry(1111, 0)])
ACTIVE = VBucketView(
    VBucketState.ACTIVE, high_seqno=10, persisted_seqno=8, purge_seqno=0, failover_table=TABLE
)
MAX = 2**64 - 1


def req(start=0, end=MAX, uuid=0, snap=None, flags: int = 0, purge=None) -> StreamRequest:
    snap = snap or (start, start)
    return StreamRequest(0, F(flags), start, end, uuid, snap[0], snap[1], purge)


@pytest.mark.parametrize(
    ("name", "stream_req", "vb", "exists", "answer"),
    [
        ("from zero", req(), ACTIVE, False, Accept(0, MAX, 0, 0, 0)),
        ("absent vbucket", req(), None, False, Refuse(Status.NotMyVbucket, "")),
        (
            "dead vbucket",
            req(),
            VBucketView(VBucketState.DEAD, 10, 8, 0, TABLE),
            False,
            Refuse(Status.NotMyVbucket, ""),
        ),
        (
            "replica ok",
            req(),
            VBucketView(VBucketState.REPLICA, 10, 8, 0, TABLE),
            False,
            Accept(0, MAX, 0, 0, 0),
        ),
        (
            "replica, ActiveVbOnly",
            req(flags=F.ActiveVbOnly),
            VBucketView(VBucketState.REPLICA, 10, 8, 0, TABLE),
            False,
            Refuse(Status.NotMyVbucket, ""),
        ),
        ("FromLatest", req(flags=F.FromLatest), ACTIVE, False, Accept(10, MAX, 10, 10, 2222)),
        (
            "start above end",
            req(start=5, end=4, uuid=2222),
            ACTIVE,
            False,
            Refuse(Status.Erange, ""),
        ),
        (
            "start outside snapshot",
            req(start=5, uuid=2222, snap=(6, 8)),
            ACTIVE,
            False,
            Refuse(Status.Erange, ""),
        ),
        (
            "existing stream beats rollback",
            req(start=5, uuid=9),
            ACTIVE,
            True,
            Refuse(Status.KeyEexists, ""),
        ),
        (
            "range beats existing stream",
            req(start=5, end=1),
            ACTIVE,
            True,
            Refuse(Status.Erange, ""),
        ),
        (
            "rollback: unknown uuid",
            req(start=5, uuid=9),
            ACTIVE,
            False,
            RollbackTo(0, REASON_NO_COMMON_HISTORY),
        ),
        (
            "rollback: spec 001",
            req(start=3, uuid=1111, snap=(1, 4)),
            ACTIVE,
            False,
            RollbackTo(1, reason_ahead(3)),
        ),
        (
            "rollback: purge",
            req(start=5, uuid=2222, snap=(4, 6)),
            VBucketView(VBucketState.ACTIVE, 10, 8, 5, TABLE),
            False,
            RollbackTo(0, reason_purged(5)),
        ),
        (
            "purge known from json",
            req(start=5, uuid=2222, snap=(4, 6), purge=5),
            VBucketView(VBucketState.ACTIVE, 10, 8, 5, TABLE),
            False,
            Accept(5, MAX, 4, 6, 2222),
        ),
        (
            "ToLatest",
            req(start=4, uuid=2222, flags=F.ToLatest),
            ACTIVE,
            False,
            Accept(4, 10, 4, 4, 2222),
        ),
        (
            "DiskOnly",
            req(start=4, uuid=2222, flags=F.DiskOnly),
            ACTIVE,
            False,
            Accept(4, 8, 4, 4, 2222),
        ),
        (
            "empty vbucket to 0",
            req(end=0),
            VBucketView(VBucketState.ACTIVE, 0, 0, 0, TABLE),
            False,
            Accept(0, 0, 0, 0, 0),
        ),
    ],
)
def test_order_of_checks(name, stream_req, vb, exists, answer) -> None:
    got = decide_stream_request(stream_req, vb, stream_exists=exists)
    if isinstance(answer, Refuse):
        assert isinstance(got, Refuse) and got.status == answer.status and got.message
    else:
        assert got == answer
