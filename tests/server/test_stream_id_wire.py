"""Stream IDs over the wire, with the independent client: two streams of one vbucket on one
connection, each message carrying its id in the flex framing extras."""

from __future__ import annotations

import struct

from dcpkv.core.vbucket import vbucket_for_key
from support.rawclient import DCP_CLOSE, DCP_END, DCP_MUTATION, RawClient
from support.serverproc import ServerProcess

VBUCKETS = 16
SID_INVALID, SUCCESS = 0x8D, 0x00


def sid_framing(sid: int) -> bytes:
    return bytes([0x22]) + struct.pack(">H", sid)  # id 2 (DCP stream id), length 2


def test_two_streams_of_a_vbucket_by_id(server: ServerProcess) -> None:
    c = RawClient(server.port)
    c.login()
    vb = vbucket_for_key(b"a", VBUCKETS)
    for i in range(5):
        c.call(0x01, b"a", b"%d" % i, struct.pack(">II", 0, 0), vbucket=vb)
    high = c.high_seqno(vb)
    c.dcp_open("sid-test", 0)
    assert c.control("enable_stream_id", "true") == SUCCESS
    assert c.stream_request(vb, end=high).status == SID_INVALID  # no id: refused
    assert c.stream_request(vb, end=high, framing=sid_framing(1)).status == SUCCESS
    assert c.stream_request(vb, end=high, framing=sid_framing(2)).status == SUCCESS
    got = c.stream_until_end(2)
    assert all(p.magic == 0x08 and p.framing[:1] == b"\x22" for p in got)
    ids = [struct.unpack(">H", p.framing[1:3])[0] for p in got]
    for sid in (1, 2):
        mine = [p for p, i in zip(got, ids, strict=True) if i == sid]
        assert [p.opcode for p in mine][-1] == DCP_END
        assert [p.value for p in mine if p.opcode == DCP_MUTATION] == [b"4"]  # deduplicated
    # CloseStream by id: the first stream has ended, so it is not found
    c.send(DCP_CLOSE, vbucket=vb, framing=sid_framing(1))
    assert c.recv_answer(DCP_CLOSE).status == 0x01
    c.close()
