"""The root of every exception the project raises.

Theory of operation
-------------------
Each layer names its own failures (a codec error, an engine refusal, a client error, a bad
Spark option...), and each keeps the builtin base it always had (``ValueError``,
``RuntimeError``, ``ConnectionError``) so existing ``except`` clauses still match. All of them
also derive from :class:`DcpkvError`, so a caller can catch "anything dcpkv refused" in one
clause, and read the memcached status the failure maps to when there is one (``status``:
the status a server answers with, or the one a server answered a client with; ``None`` when
the failure is not about a status at all).
"""

from __future__ import annotations

from dcpkv.core.status import Status


class DcpkvError(Exception):
    """A failure dcpkv raises; ``status`` is the wire status it stands for, if any."""

    status: Status | int | None = None

    def __init__(self, *args: object, status: Status | int | None = None) -> None:
        super().__init__(*args)
        if status is not None:
            self.status = status
