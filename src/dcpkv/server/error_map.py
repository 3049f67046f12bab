"""The error map a client fetches with GetErrorMap once it negotiated Xerror.

Clients use the attributes to decide what to do with a status they get: ``retry-now``,
``retry-later``, ``item-only``, ``invalid-input``, ``fetch-config``, ``conn-state-invalidated``...
Only the statuses this server answers are listed.
"""

from __future__ import annotations

import json

from dcpkv.protocol.constants import Status

_ENTRIES: dict[Status, tuple[str, list[str]]] = {
    Status.Success: ("Success", ["success"]),
    Status.KeyEnoent: ("Not found", ["item-only"]),
    Status.KeyEexists: ("CAS mismatch or key exists", ["item-only"]),
    Status.E2big: ("Value or key too large", ["invalid-input"]),
    Status.Einval: ("Invalid arguments", ["invalid-input"]),
    Status.NotStored: ("Not stored", ["item-only"]),
    Status.DeltaBadval: ("Value is not a number", ["item-only", "invalid-input"]),
    Status.NotMyVbucket: ("Vbucket not on this node", ["fetch-config", "invalid-input"]),
    Status.NoBucket: ("No bucket selected", ["conn-state-invalidated"]),
    Status.DcpStreamNotFound: ("No such DCP stream", ["invalid-input"]),
    Status.AuthError: ("Authentication failed", ["auth", "conn-state-invalidated"]),
    Status.AuthContinue: ("Authentication continues", ["auth", "support"]),
    Status.Erange: ("Range error", ["invalid-input"]),
    Status.Rollback: ("Rollback required", ["special-handling"]),
    Status.Eaccess: ("No access", ["auth", "conn-state-invalidated"]),
    Status.NotInitialized: ("Not initialized", ["conn-state-invalidated", "retry-later"]),
    Status.UnknownCommand: ("Unknown command", ["support", "invalid-input"]),
    Status.Enomem: ("Out of memory", ["temp", "retry-later"]),
    Status.NotSupported: ("Not supported", ["support"]),
    Status.Einternal: ("Internal error", ["internal"]),
    Status.Ebusy: ("Busy", ["temp", "retry-now"]),
    Status.Etmpfail: ("Temporary failure", ["temp", "retry-later"]),
}


def error_map_json(version: int = 1, revision: int = 1) -> bytes:
    errors = {
        f"{int(status):x}": {"name": status.name.upper(), "desc": desc, "attrs": attrs}
        for status, (desc, attrs) in _ENTRIES.items()
    }
    doc = {"version": min(version, 2), "revision": revision, "errors": errors}
    return json.dumps(doc, separators=(",", ":")).encode()
