"""The documentation tests run real ``dcpkv server`` processes (``tests/server``'s helpers),
stopped by PID at the end of the session."""

from __future__ import annotations
