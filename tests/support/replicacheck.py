"""What a node holds, read over the wire, to compare replicas with their actives: the shared
checks of the replication tests (``tests/server``) and the cluster tests (``tests/cluster``).

``contents`` is what a DCP consumer streaming every vbucket from 0 ends with, ``failover_logs``
each vbucket's failover log, ``seqnos`` the high seqnos (GetAllVbSeqnos); two nodes holding
the same vbuckets equally answer the same to all three. Waits are bounded polling loops.
"""

from __future__ import annotations

from collections.abc import Iterable

from dcpkv.core.status import Status
from dcpkv.protocol import dcp
from support.dcpclient import DcpClient, VbState, all_vb_seqnos
from support.kvclient import KVClient, poll_rounds

VBUCKETS = 16  # what ServerProcess starts a node with

Doc = tuple[int, int, bytes | None]  # (seqno of the latest version, its CAS, value or None)


class StreamStalled(AssertionError):
    """A stream stopped below the high seqno the node reported: it ended early (Rollback:
    the node is a replica that rolled back after the stream opened) or timed out."""


def admin(port: int) -> KVClient:
    client = KVClient(port)
    assert client.login().status == Status.Success
    return client


def seqnos(port: int) -> dict[int, int]:
    client = DcpClient(port, open_=False)
    try:
        return all_vb_seqnos(client)
    finally:
        client.close()


def wait_caught_up(active: int, replica: int) -> dict[int, int]:
    target = seqnos(active)
    for _ in poll_rounds(60, 0.02):
        if seqnos(replica) == target:
            return target
    raise AssertionError(f"replica never caught up: {seqnos(replica)} vs {target}")


def contents(
    port: int, name: str, vbuckets: Iterable[int] | None = None, timeout: float | None = None
) -> dict[int, dict[bytes, Doc]]:
    """Every vbucket's documents (of ``vbuckets``, else all) as a DCP consumer from 0 ends
    with: key -> (the seqno of its latest version, its CAS, its value or None for a
    tombstone). (Which older versions a stream shows depends on deduplication, which differs
    between a node's memory and its disk.)"""
    client = DcpClient(port, name=name)
    if timeout is not None:
        client.sock.settimeout(timeout)
    try:
        highs = all_vb_seqnos(client)
        wanted = sorted(range(VBUCKETS) if vbuckets is None else vbuckets)
        for vb in wanted:
            assert isinstance(client.stream(vb, start=0, end=highs[vb]), dcp.StreamRequestOk)

        def reached_or_ended() -> bool:
            states = {vb: client.vbs.get(vb, VbState()) for vb in wanted}
            early = {vb: st.ended for vb, st in states.items() if st.ended not in (None, 0)}
            if early:
                raise StreamStalled(f"port {port}: streams ended early (vb: reason) {early}")
            # A stream ends (StreamEnd, ok) at its end seqno even where the last items are
            # SyncWrite prepares or aborts, which a plain consumer never sees.
            return all(st.seqno >= highs[vb] or st.ended == 0 for vb, st in states.items())

        try:
            client.follow(reached_or_ended)
        except TimeoutError:
            reached = {vb: st.seqno for vb, st in client.vbs.items()}
            raise StreamStalled(
                f"port {port}: streams stalled at {reached}, highs {highs}"
            ) from None
        out: dict[int, dict[bytes, Doc]] = {vb: {} for vb in wanted}
        for vb in wanted:
            st = client.vbs.get(vb)
            for msg in [] if st is None else sorted(st.items, key=lambda m: m.by_seqno):
                value = None if not isinstance(msg, dcp.Mutation) else bytes(msg.value)
                out[vb][bytes(msg.key)] = (msg.by_seqno, msg.cas, value)
        return out
    finally:
        client.close()


def failover_logs(
    port: int, vbuckets: Iterable[int] | None = None
) -> dict[int, tuple[object, ...]]:
    client = DcpClient(port, name="logs")
    try:
        logs = {}
        for vb in range(VBUCKETS) if vbuckets is None else vbuckets:
            answer = client.call(dcp.GetFailoverLog(vbucket=vb))
            assert isinstance(answer, dcp.GetFailoverLogResponse)
            logs[vb] = tuple(answer.failover_log)
        return logs
    finally:
        client.close()


def wait_equal(active: int, replica: int, vbuckets: list[int], limit_s: float = 60) -> None:
    """Poll until the replica holds what the active holds in ``vbuckets`` (contents and
    failover logs). The high seqnos are compared first: streaming a replica that is still
    rolling back could wait for a seqno it no longer has."""
    for _ in poll_rounds(limit_s, 0.1):
        high = seqnos(active)
        if {vb: seqnos(replica).get(vb) for vb in vbuckets} != {vb: high[vb] for vb in vbuckets}:
            continue
        try:
            theirs = contents(replica, "check-replica", vbuckets, timeout=2.0)
        except StreamStalled:
            # The replica rolled back after our stream opened (its streams end with
            # Rollback): the highs we compared are gone; compare again.
            continue
        if theirs == contents(active, "check", vbuckets):
            assert failover_logs(replica, vbuckets) == failover_logs(active, vbuckets)
            return
    high, theirs_high = seqnos(active), seqnos(replica)
    differ = {
        vb: (high.get(vb), theirs_high.get(vb))
        for vb in vbuckets
        if high.get(vb) != theirs_high.get(vb)
    }
    raise AssertionError(
        f"port {replica} never became equal to port {active} for {vbuckets}"
        f" (high seqnos active, replica: {differ or 'equal'})"
    )
