"""``protocol/fast_stat.py``: runs of Stat answers read without a Frame each give exactly the
frames the general path gives, and leave it everything else, in wire order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.core.status import Status
from dcpkv.protocol import FrameParser, kv
from dcpkv.protocol.base import GenericResponse
from dcpkv.protocol.constants import Opcode
from dcpkv.protocol.fast_stat import StatRun, stat_run
from dcpkv.protocol.frame import Frame

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)

# one answer's frames: stats, then the empty one that ends it; or an error answer; or another
# kind of frame in between (a DCP noop request)
_PIECES = st.one_of(
    st.tuples(st.integers(0, 2**32 - 1), st.lists(st.tuples(_TEXT.filter(bool), _TEXT),
                                                  max_size=8)).map(
        lambda t: kv.encode_stats(t[0], t[1])),
    st.integers(0, 2**32 - 1).map(
        lambda o: GenericResponse(opcode=Opcode.Stat, opaque=o, status=Status.KeyEnoent).encode()),
    st.integers(0, 2**32 - 1).map(
        lambda o: GenericResponse(opcode=Opcode.DcpNoop, opaque=o).encode()),
)  # fmt: skip


def _as_frames(items: list[StatRun | Frame]) -> list[tuple[int, bytes, bytes]]:
    """Each item as (opaque, key, value): a run's stats, a frame's own."""
    out: list[tuple[int, bytes, bytes]] = []
    for item in items:
        if isinstance(item, StatRun):
            out += item
        else:
            out.append((item.opaque, bytes(item.key), bytes(item.value)))
    return out


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(_PIECES, max_size=8), cuts=st.lists(st.integers(1, 400), max_size=6))
def test_stat_runs_are_the_general_paths_frames(pieces: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(pieces)
    general = list(FrameParser().feed(wire))
    parser = FrameParser()
    items: list[StatRun | Frame] = []
    at = 0
    for cut in [*cuts, len(wire)]:  # the bytes arrive in reads of any size
        items += parser.feed_runs(wire[at : at + cut], stat_run)
        at += cut
    assert _as_frames(items) == [(f.opaque, bytes(f.key), bytes(f.value)) for f in general]


def test_a_run_stops_at_the_end_of_the_answer() -> None:
    wire = kv.encode_stats(7, [("a", "1"), ("b", "22")])
    items = list(FrameParser().feed_runs(wire, stat_run))
    assert items[0] == [(7, b"a", b"1"), (7, b"b", b"22")]
    (end,) = items[1:]
    assert isinstance(end, Frame) and end.opaque == 7 and not end.key
