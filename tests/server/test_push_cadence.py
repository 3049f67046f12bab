"""The push cadence: the case table of ``server/push_cadence.py``, then its invariants."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dcpkv.server.push_cadence import BATCH_ITEMS, PUMP_GAP_S, QUIET_S, delay

NOW = 1_000.0
GAP = PUMP_GAP_S


@dataclass(frozen=True)
class Case:
    name: str
    last_pump: float
    waiting: int
    wait: float | None
    sync_write: bool = False


CASES = [
    Case("N: nothing waits, just after a pump", NOW - 0.0001, 0, None),
    Case("N: nothing waits, a SyncWrite's neither", NOW, 0, None, sync_write=True),
    Case("N: nothing waits after a quiet moment", NOW - 10.0, 0, None),
    Case("S: a prepare just after a pump", NOW - 0.0001, 1, 0.0, sync_write=True),
    Case("S: at the pump's moment", NOW, BATCH_ITEMS - 1, 0.0, sync_write=True),
    Case("Q: never pumped", -math.inf, 1, 0.0),
    Case("Q: the last pump a quiet moment ago", NOW - QUIET_S * 1.01, 1, 0.0),
    Case("Q: a paced writer's next batch of two, 1 ms on", NOW - 0.001, 2, 0.0),
    Case("Q: the last pump long ago", NOW - 10.0, 1, 0.0),
    Case("B: a batch waits, just after a pump", NOW - QUIET_S / 10, BATCH_ITEMS, 0.0),
    Case("B: a big batch", NOW, 500, 0.0),
    Case("T: one write just after a pump: the rest of the gap", NOW - 0.0001, 1, GAP - 0.0001),
    Case("T: just under a batch, at the pump's moment", NOW, BATCH_ITEMS - 1, GAP),
    Case("T: nearly quiet", NOW - QUIET_S * 0.99, 2, GAP - QUIET_S * 0.99),
    Case("T: a clock that stepped back waits one gap, not the step", NOW + 60.0, 1, GAP),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_case_table(case: Case) -> None:
    wait = delay(case.last_pump, case.waiting, NOW, case.sync_write)
    assert wait == (None if case.wait is None else pytest.approx(case.wait))


@given(
    since=st.floats(min_value=-1.0, max_value=1.0, allow_nan=False),
    waiting=st.integers(min_value=0, max_value=10_000),
    sync_write=st.booleans(),
)
def test_a_wait_is_at_most_one_gap_and_only_for_a_trickle(
    since: float, waiting: int, sync_write: bool
) -> None:
    last = NOW - since
    wait = delay(last, waiting, NOW, sync_write)
    assert (wait is None) == (waiting == 0)  # a pump only for something, a timer neither
    if wait is None:
        return
    assert 0.0 <= wait <= GAP
    if wait > 0.0:
        assert waiting < BATCH_ITEMS and NOW - last < QUIET_S and not sync_write
        # waiting ends at the gap's end (or, for a clock that stepped back, one gap from now)
        assert wait == pytest.approx(min(GAP - since, GAP))


@settings(deadline=None)
@given(spacing=st.floats(min_value=1e-5, max_value=3 * QUIET_S, allow_nan=False))
def test_a_trickle_is_pumped_about_once_a_gap(spacing: float) -> None:
    """One write every ``spacing`` seconds for 0.1 s, each queueing one item: a pump that
    waits takes every write queued meanwhile. Pumps never come closer than a gap, and writes
    a quiet moment apart are each pumped at once."""
    assume(abs(spacing - QUIET_S) > QUIET_S / 1000)  # (a sum of spacings is not exact)
    last, pumps, due, t, writes = -math.inf, [], math.inf, 0.0, 0
    while t < 0.1:
        writes += 1
        if due <= t:  # the waiting pump ran
            last, due = due, math.inf
            pumps.append(last)
        if due == math.inf:
            wait = delay(last, 1, t)
            if wait == 0.0:
                last = t
                pumps.append(t)
            else:
                due = t + wait
        t += spacing
    gaps = [b - a for a, b in itertools.pairwise(pumps)]
    if spacing > QUIET_S:
        assert len(pumps) == writes
    else:
        assert all(g >= GAP * (1 - 1e-9) for g in gaps)
