"""Child processes a job owns: they die with it.

Theory of operation
-------------------
A job (``dcpkv demo``, ``dcpkv cluster up``) starts servers and a manager as children in
their own process group, so a Ctrl-C at the terminal reaches only the job, which then stops
them in its own order. The other side of that: a ``kill -9`` of the job would leave them
running. On Linux each child therefore asks the kernel, between fork and exec, for SIGTERM
when its parent dies (``PR_SET_PDEATHSIG``); elsewhere nothing is asked.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """``preexec_fn`` of a child: SIGTERM when the parent dies (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
