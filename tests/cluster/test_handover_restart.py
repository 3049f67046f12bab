"""A manager that died during a group of handovers ends the group when it starts again (issue
29): the vbucket whose new active took over goes in the map, the one whose new copy had not
taken over is put back on its old active, and the map's rev is above any the dead manager may
have pushed. Real processes; the dead manager's group is written into its file and the nodes'
states set by hand as it left them (a pending copy would finish its takeover by itself, so the
second one is left a replica: the manager died before making it pending), so what the restart
decides is certain."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from dcpkv.cluster.config import FILE_NAME
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol.constants import Opcode
from support.managerproc import ManagerProcess, client, start_cluster
from support.rebalancecheck import served_map
from support.serverproc import ServerProcess


def set_state(node: ServerProcess, vb: int, state: VBucketState) -> None:
    with client(node) as kv:
        answer = kv.call(Opcode.SetVbucket, extras=struct.pack(">I", state), vbucket=vb)
        assert answer.status == Status.Success


def states(node: ServerProcess) -> dict[int, str]:
    with client(node) as kv:
        return {int(k[3:]): v for k, v in kv.stats(b"vbucket").items() if k.startswith("vb_")}


def test_a_group_under_way_when_the_manager_died_is_ended_on_restart(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=0)
    a, b = cluster.nodes
    before = served_map(cluster.nodes)
    on_a = [
        vb for vb, chain in enumerate(before.chains) if before.servers[chain[0]] == cluster.name(a)
    ]
    done, untouched = on_a[:2]
    cluster.manager.kill9()
    # the dead manager's group: two of a's vbuckets to b; one handed over, one not yet begun
    path = tmp_path / "manager" / FILE_NAME
    doc = json.loads(path.read_text())
    rev = before.rev + 1
    doc["rebalance"].update(
        state="running",
        handover={
            "bucket": "default",
            "rev": rev,
            "moves": [[vb, [cluster.name(a)], [cluster.name(b)]] for vb in (done, untouched)],
        },
    )
    path.write_text(json.dumps(doc))
    set_state(b, done, VBucketState.ACTIVE)
    set_state(a, done, VBucketState.DEAD)
    set_state(b, untouched, VBucketState.REPLICA)
    cluster.manager.start()
    after = served_map(cluster.nodes)
    assert after.servers[after.chains[done][0]] == cluster.name(b)
    assert after.servers[after.chains[untouched][0]] == cluster.name(a)
    assert after.rev == rev + 3  # above the commit and the staged map it may have pushed
    assert states(a)[untouched] == "active" and states(b)[untouched] == "dead"  # put back
    assert states(b)[done] == "active"
    assert json.loads(path.read_text())["rebalance"]["handover"] is None
    status = cluster.manager.api("GET", "/pools/default/rebalanceProgress")
    assert status["state"] == "interrupted"  # a re-run finishes the rebalance
