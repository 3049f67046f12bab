"""Failed logins rate-limited per source address, sans-I/O (the clock is the caller's).

Theory of operation
-------------------
Each source address (the client's IP, not its port: a guesser opens new connections) keeps the
times of its recent failed logins. Once it has ``max_failures`` within ``window_s`` seconds,
every login attempt from it is refused, without checking the password, until the oldest of
those failures leaves the window. A right password does not clear the record (it would let a
guesser holding one account test others freely). Addresses whose failures all left the window
are forgotten, and the table holds at most ``max_addresses``, dropping the quietest, so a flood
from many addresses cannot grow the server's memory.

=====================================  ===========================================
situation                              answer
=====================================  ===========================================
under ``max_failures`` in the window   the login is checked as usual
``max_failures`` or more in it         refused at once (AuthError, "too many ...")
=====================================  ===========================================
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MAX_FAILURES = 5
WINDOW_S = 10.0
MAX_ADDRESSES = 10_000


@dataclass
class LoginThrottle:
    max_failures: int = MAX_FAILURES
    window_s: float = WINDOW_S
    max_addresses: int = MAX_ADDRESSES
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    throttled: int = 0  # login attempts refused unchecked (a stat)

    def blocked(self, address: str, now: float) -> bool:
        """Whether a login from ``address`` is refused unchecked (counts it if so)."""
        times = self._recent(address, now)
        if times is not None and len(times) >= self.max_failures:
            self.throttled += 1
            return True
        return False

    def failed(self, address: str, now: float) -> None:
        times = self._recent(address, now)
        if times is None:
            if len(self._failures) >= self.max_addresses:
                self._forget_oldest()
            times = self._failures[address] = deque(maxlen=self.max_failures)
        times.append(now)

    def _recent(self, address: str, now: float) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def _forget_oldest(self) -> None:
        oldest = min(self._failures, key=lambda a: self._failures[a][-1])
        del self._failures[oldest]
