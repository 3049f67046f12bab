"""The one exception the codec raises.

Theory of operation
-------------------
Whatever is wrong with bytes from the network (a short body, a bad extras length, an opcode we
do not know, a value over the limit), the codec raises :class:`CodecError` and nothing else.
It carries the status a server should answer with (``Einval`` for malformed input, ``E2big``
for oversize values, ``UnknownCommand`` for opcodes without a message type) and a message that
names the offending field, so a server can reply and close without guessing.
"""

from __future__ import annotations

from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status


class CodecError(DcpkvError):
    """Malformed, oversize or unknown wire data; ``status`` is what a server should answer."""

    status: Status

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __repr__(self) -> str:
        return f"CodecError({self.status.name}, {self.message!r})"

    def __str__(self) -> str:
        return f"{self.status.name}: {self.message}"
