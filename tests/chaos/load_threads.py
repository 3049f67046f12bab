"""The chaos loads' threads: each loop in a daemon thread that logs why it died."""

from __future__ import annotations

import threading
from collections.abc import Callable


class LoadThreads:
    """Runs each loop in a daemon thread; a loop that raises is logged as ``{what}
    {loop name} failed`` before its thread ends, so a load never stops silently."""

    def __init__(self, log: Callable[[str], None], what: str, *loops: Callable[[], None]) -> None:
        self._log = log
        self._what = what
        self.threads = [threading.Thread(target=self._guard(loop), daemon=True) for loop in loops]

    def _guard(self, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                loop()
            except Exception as exc:  # a load thread must not die silently
                self._log(f"{self._what} {loop.__name__} failed: {exc!r}")
                raise

        return run

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float = 60) -> None:
        for t in self.threads:
            t.join(timeout=timeout)
