"""The embedded defaults a server and its clients agree on without being told.

Theory of operation
-------------------
A fresh ``dcpkv server`` listens on 127.0.0.1:11210 with bucket ``default`` and one user,
``Administrator`` / ``password`` (Couchbase's conventional development login); every client,
command and Spark option defaults to the same. Written once here, so the server's embedded
config and the clients' defaults cannot drift apart.
"""

from __future__ import annotations

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 11210
DEFAULT_BUCKET = "default"
DEFAULT_USER = "Administrator"
DEFAULT_PASSWORD = "password"
