"""A node fences managers of an older term (core/manager_term.py): a manager names its term
in its Hello; once a node has seen a term, a connection of an older one cannot change its
vbuckets or its map, and the node logs each refusal."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from dcpkv.core.manager_term import agent_for
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol.constants import Datatype, Opcode
from support.kvclient import KVClient
from support.serverproc import ServerProcess

ACTIVE = struct.pack(">I", VBucketState.ACTIVE)


def manager(port: int, term: int) -> KVClient:
    kv = KVClient(port)
    assert kv.login().status == Status.Success
    if term:
        assert kv.call(Opcode.Hello, key=agent_for(term).encode()).status == Status.Success
    return kv


def cas_of(kv: KVClient, vbucket: int) -> int:
    return kv.call(Opcode.GetVbucket, vbucket=vbucket).cas


def push(kv: KVClient, rev: int, epoch: int) -> int:
    doc = {"rev": rev, "revEpoch": epoch, "name": "default",
           "vBucketServerMap": {"vBucketMap": [[0]] * 16}}  # fmt: skip
    frame = kv.call(Opcode.SetClusterConfig, key=b"default", value=json.dumps(doc).encode(),
                    datatype=Datatype.JSON)  # fmt: skip
    return frame.status


@pytest.fixture
def node(server_factory: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", "--managed")
    srv.start()
    return srv


def test_a_deposed_managers_commands_are_refused_and_logged(node: ServerProcess) -> None:
    old = manager(node.port, 5)
    assert old.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=1, cas=cas_of(old, 1)).status == 0
    assert push(old, rev=1, epoch=5) == Status.Success
    new = manager(node.port, 9)  # the next leader connects
    refused = old.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=2, cas=cas_of(old, 2))
    assert refused.status == Status.Eaccess
    assert b"manager term 5 is older than term 9" in bytes(refused.value)
    assert old.call(Opcode.DelVbucket, vbucket=1, cas=cas_of(old, 1)).status == Status.Eaccess
    assert push(old, rev=7, epoch=5) == Status.Eaccess
    assert manager(node.port, 0).call(Opcode.SetVbucket, extras=ACTIVE, vbucket=3).status == (
        Status.Eaccess  # a connection naming no term, once managers name theirs
    )
    assert new.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=2, cas=cas_of(new, 2)).status == 0
    assert push(new, rev=1, epoch=9) == Status.Success
    assert cas_of(new, 1) != 0 and new.call(Opcode.GetVbucket, vbucket=1).status == 0
    assert "refused SetVbucket 2" in node.log() and "refused DelVbucket 1" in node.log()
    assert "refused SetClusterConfig default" in node.log()


def test_without_terms_nothing_is_fenced(node: ServerProcess) -> None:
    plain = manager(node.port, 0)
    assert plain.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=1, cas=cas_of(plain, 1)).status == 0
    assert push(plain, rev=1, epoch=1) == Status.Success


@pytest.mark.parametrize("stop", ["kill -9", "SIGTERM"])
def test_a_restarted_node_still_fences_the_terms_before_the_newest_it_saw(
    node: ServerProcess, stop: str
) -> None:
    """The newest term is kept in the data folder before the Hello is answered: a deposed
    leader that connects again after the node restarted (kill -9 included) is refused."""
    manager(node.port, 5).close()
    manager(node.port, 9).close()  # the next leader's Hello: then the node stops
    if stop == "kill -9":
        node.kill9()
    else:
        assert node.terminate() == 0
    node.start(same_port=True)
    old = manager(node.port, 5)
    refused = old.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=2, cas=cas_of(old, 2))
    assert refused.status == Status.Eaccess
    assert b"manager term 5 is older than term 9" in bytes(refused.value)
    assert push(old, rev=3, epoch=5) == Status.Eaccess
    new = manager(node.port, 9)
    assert new.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=2, cas=cas_of(new, 2)).status == 0
    assert push(new, rev=3, epoch=9) == Status.Success
