"""The error map a client fetches with GetErrorMap once it negotiated Xerror.

Theory of operation
-------------------
The facts (per status a description and attributes such as ``retry-later`` or
``fetch-config``) are the core's :data:`dcpkv.core.status.ERROR_MAP`, which our own clients
read too; this module only renders them as the JSON document of the GetErrorMap answer.
"""

from __future__ import annotations

import json

from dcpkv.core.status import ERROR_MAP


def error_map_json(version: int = 1, revision: int = 1) -> bytes:
    errors = {
        f"{int(status):x}": {
            "name": status.name.upper(),
            "desc": info.desc,
            "attrs": [str(a) for a in info.attrs],
        }
        for status, info in ERROR_MAP.items()
    }
    doc = {"version": min(version, 2), "revision": revision, "errors": errors}
    return json.dumps(doc, separators=(",", ":")).encode()
