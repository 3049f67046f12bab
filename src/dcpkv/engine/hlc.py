"""CAS values as a hybrid logical clock (HLC), and the injectable wall clock.

Theory of operation
-------------------
A CAS is a 64-bit value that must change on every mutation of a document and, for conflict
resolution across clusters, should order mutations roughly by real time. The HLC gives both:
the physical part is the wall clock in nanoseconds with the low 16 bits cleared (so the upper
48 bits carry time), and each value handed out is ``max(physical, last + 1)``: strictly
increasing per vbucket even when the wall clock stalls or steps back, and never below a CAS the
vbucket has already seen (:meth:`HybridLogicalClock.observe` feeds in CAS values that arrive
from elsewhere: replicated items, warm-up's max CAS).

Time comes from a :class:`Clock` (``time()`` in float unix seconds). Production uses
:class:`SystemClock`; tests use :class:`ManualClock` and move it by hand, which also drives
expiry.
"""

from __future__ import annotations

import time
from typing import Protocol

_LOW_BITS_MASK = ~0xFFFF
U64_MASK = (1 << 64) - 1
_PHYSICAL_MASK = _LOW_BITS_MASK & U64_MASK  # one AND per CAS, not two


class Clock(Protocol):
    def time(self) -> float:
        """Unix time in seconds."""
        ...


class SystemClock:
    # The builtin itself, not a method wrapping it: every write reads the clock, and a
    # Python frame per read cost ~0.1 us.
    time = staticmethod(time.time)


class ManualClock:
    """A clock that moves only when told to (tests, simulations)."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class HybridLogicalClock:
    """Hands out strictly increasing CAS values, close to wall-clock nanoseconds."""

    __slots__ = ("_clock", "_last")

    def __init__(self, clock: Clock, last: int = 0) -> None:
        self._clock = clock
        self._last = last

    @property
    def max_cas(self) -> int:
        return self._last

    def physical(self) -> int:
        return int(self._clock.time() * 1_000_000_000) & _PHYSICAL_MASK

    def next_cas(self) -> int:
        # physical() inlined, and no max() call: every write takes a CAS
        cas = int(self._clock.time() * 1_000_000_000) & _PHYSICAL_MASK
        if cas <= self._last:
            cas = self._last + 1
        self._last = cas
        return cas

    def observe(self, cas: int) -> None:
        """Never hand out a CAS at or below one already seen."""
        if cas > self._last:
            self._last = cas
