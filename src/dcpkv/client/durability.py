"""Durable writes the server guarantees (SyncWrites, PROTOCOL.md "SyncWrites"): what a client
asks, and what the server's refusals mean.

Theory of operation
-------------------
A write given a :class:`ServerDurability` (or just a :class:`Durability` level) is sent with a
durability requirement in its framing extras (flex request magic 0x08, frame info id 1: the
level, and the timeout in ms when one is given; :func:`requirement`). The server answers it
once the write is committed at that level, or refuses it. Each refusal is its own exception,
a :class:`SyncWriteError` (a :class:`~dcpkv.core.durability.DurabilityError`, so a
``DcpkvError``) carrying the status and what the caller may do (:attr:`SyncWriteError.retry`):

=====  ===================================  ===========  =========================================
code   exception                            retry        meaning
=====  ===================================  ===========  =========================================
0xa0   :class:`DurabilityInvalidLevelError`  never        the level is not one the server knows
0xa1   :class:`SyncWriteImpossibleError`     never        the vbucket's chain cannot reach a
                                                          majority (one node and a replica
                                                          configured but absent; no topology)
0xa2   :class:`SyncWriteInProgressError`     later        another durable write of the key is
                                                          pending: nothing was written
0xa3   :class:`SyncWriteAmbiguousError`      after-read   the write timed out or its active
                                                          changed state: it may or may not be
                                                          committed; read the key to find out
0xa4   :class:`SyncWriteReCommitInProgress   later        a new active is re-committing the key's
       Error`                                             prepare
=====  ===================================  ===========  =========================================

:func:`sync_write_error` maps a status to its exception (None for any other status). The
level names of the bucket setting ``durability_min_level`` and of the commands' options
(``none``, ``majority``, ``majorityAndPersistActive``, ``persistToMajority``) are parsed by
:func:`parse_durability`.

Client durability (ObserveSeqno polling, :mod:`dcpkv.core.durability`) is the other way to
ask for durability; it works without SyncWrites but acknowledges a write that other readers
saw before it was durable, and cannot tell a lost write from a slow one until it polls again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from dcpkv.core.durability import DurabilityError, DurabilityImpossibleError
from dcpkv.core.status import Status
from dcpkv.protocol.constants import DurabilityLevel
from dcpkv.protocol.durability import DurabilityRequirement, level_named

MAX_TIMEOUT_S = 65.534  # the wire's u16 of milliseconds (0 and 0xffff are reserved)


class Durability(IntEnum):
    """A write's durability level, as the SDKs name them (``DurabilityLevel``)."""

    NONE = 0
    MAJORITY = DurabilityLevel.Majority
    MAJORITY_AND_PERSIST_TO_ACTIVE = DurabilityLevel.MajorityAndPersistToActive
    PERSIST_TO_MAJORITY = DurabilityLevel.PersistToMajority


def parse_durability(text: str) -> Durability:
    """``majority``, ``majorityAndPersistActive``, ``persistToMajority`` or ``none`` (any case;
    the SDK's upper-case names too); ValueError otherwise."""
    level = level_named(text)
    return Durability.NONE if level is None else Durability(level)


@dataclass(frozen=True, slots=True)
class ServerDurability:
    """A write's durability requirement: a level and, optionally, how long the server may take
    to meet it (seconds; None: the bucket's default, 30 s unless configured)."""

    level: Durability = Durability.MAJORITY
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None and not 0.001 <= self.timeout <= MAX_TIMEOUT_S:
            raise ValueError(f"durability timeout {self.timeout} s: must be 0.001..65.534 s")

    @property
    def wait_s(self) -> float:
        """How long the answer may take at most: the timeout, or without one the longest a
        bucket's default may be (the client must not give up before the server decides)."""
        return MAX_TIMEOUT_S if self.timeout is None else self.timeout


DurabilityOption = ServerDurability | Durability | None


def server_durability(option: DurabilityOption) -> ServerDurability | None:
    """``option`` as a ServerDurability (None, or Durability.NONE: no requirement)."""
    if option is None or isinstance(option, ServerDurability):
        return None if option is None or option.level == Durability.NONE else option
    return None if option == Durability.NONE else ServerDurability(Durability(option))


def requirement(option: DurabilityOption) -> DurabilityRequirement | None:
    """The wire's requirement for ``option`` (None: a plain write)."""
    durable = server_durability(option)
    if durable is None:
        return None
    ms = None if durable.timeout is None else max(1, round(durable.timeout * 1000))
    return DurabilityRequirement(DurabilityLevel(durable.level), ms)


def framing(option: DurabilityOption) -> bytes:
    """The framing extras a write with ``option`` carries (empty: none)."""
    required = requirement(option)
    return b"" if required is None else required.encode()


class SyncWriteError(DurabilityError):
    """The server refused or could not settle a durable write; :attr:`status` is its status,
    :attr:`retry` what the caller may do: ``never``, ``later`` (the same write may succeed
    after a pause) or ``after-read`` (the outcome is unknown: read the key first)."""

    retry = "never"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, status=status)

    @property
    def retry_later(self) -> bool:
        return self.retry == "later"


class DurabilityInvalidLevelError(SyncWriteError, ValueError):
    """0xa0: the server does not know the level."""


class SyncWriteImpossibleError(SyncWriteError, DurabilityImpossibleError):
    """0xa1: the vbucket's replication chain cannot satisfy the level now."""


class SyncWriteInProgressError(SyncWriteError):
    """0xa2: the key has a pending durable write; nothing was written."""

    retry = "later"


class SyncWriteAmbiguousError(SyncWriteError):
    """0xa3: timed out or the active changed state: the write may be committed or not."""

    retry = "after-read"


class SyncWriteReCommitInProgressError(SyncWriteError):
    """0xa4: a newly promoted active is re-committing the key's durable write."""

    retry = "later"


_ERRORS: dict[int, type[SyncWriteError]] = {
    Status.DurabilityInvalidLevel: DurabilityInvalidLevelError,
    Status.DurabilityImpossible: SyncWriteImpossibleError,
    Status.SyncWriteInProgress: SyncWriteInProgressError,
    Status.SyncWriteAmbiguous: SyncWriteAmbiguousError,
    Status.SyncWriteReCommitInProgress: SyncWriteReCommitInProgressError,
}


def sync_write_error(status: int, what: str) -> SyncWriteError | None:
    """The exception of a SyncWrite status (the module docstring's table), None for others."""
    error = _ERRORS.get(status)
    if error is None:
        return None
    return error(f"{what}: {Status(status).name}", status)
