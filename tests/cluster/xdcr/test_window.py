"""XDCR's window of writes in flight: the acknowledged progress never passes an unwritten
batch, whatever order the batches finish in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dcpkv.client.offsets import VbucketOffset
from dcpkv.cluster.xdcr.window import Window


def at(seqno: int) -> VbucketOffset:
    return VbucketOffset.at(seqno, 7)


def test_a_batch_counts_only_once_every_older_one_is_written() -> None:
    w = Window({0: at(3)})
    w.took(0, at(4))
    w.took(1, at(1))
    first = w.cut()
    w.took(0, at(5))
    second = w.cut()
    empty = w.cut()  # nothing taken since: finished with the others
    w.done(second)
    w.done(empty)
    assert w.acked == {0: at(3)} and w.in_flight == 3  # the first is still out
    w.done(first)
    assert w.acked == {0: at(5), 1: at(1)} and w.in_flight == 0


# Each batch takes a few (vbucket, seqno) changes, seqnos rising per vbucket as a stream's do;
# the batches finish in an arbitrary order, some never (a failed write).
batches = st.lists(
    st.lists(st.integers(min_value=0, max_value=3), min_size=0, max_size=4), max_size=12
)


@given(batches, st.randoms(use_true_random=False), st.integers(min_value=0, max_value=12))
def test_acked_is_the_progress_of_the_longest_written_prefix(
    plan: list[list[int]], rng: object, unfinished: int
) -> None:
    w = Window()
    seqno: dict[int, int] = {}
    progress_after: list[dict[int, VbucketOffset]] = []  # what a serial writer would have
    tickets = []
    for vbs in plan:
        for vb in vbs:
            seqno[vb] = seqno.get(vb, 0) + 1
            w.took(vb, at(seqno[vb]))
        tickets.append(w.cut())
        progress_after.append({vb: at(s) for vb, s in seqno.items()})
    order = list(range(len(tickets)))
    rng.shuffle(order)  # type: ignore[attr-defined]
    failed = order[unfinished] if unfinished < len(order) else None
    finished: set[int] = set()
    for i in order:
        if i == failed:
            continue
        w.done(tickets[i])
        finished.add(i)
        prefix = 0
        while prefix in finished:
            prefix += 1
        assert w.acked == (progress_after[prefix - 1] if prefix else {})
