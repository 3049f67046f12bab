"""The source's fixed row schema as names and Spark SQL types, without pyarrow.

Theory of operation
-------------------
Spark asks a Python data source for its schema in a planner process of its own (the source's
creation), which needs nothing else of ours; importing pyarrow and the client library there
cost a cold query about 0.2 s per such process. So the schema's one definition lives here,
in plain strings: :data:`SCHEMA_DDL` for Spark, and ``rows.py`` builds the Arrow schema the
tasks' record batches carry from the same list (``rows.py`` says what each column holds).
"""

from __future__ import annotations

COLUMN_TYPES: tuple[tuple[str, str], ...] = (
    ("op", "STRING"),
    ("vbucket", "INT"),
    ("key", "BINARY"),
    ("value", "BINARY"),
    ("datatype", "INT"),
    ("flags", "BIGINT"),
    ("expiry", "BIGINT"),
    ("cas", "BIGINT"),
    ("rev_seqno", "BIGINT"),
    ("seqno", "BIGINT"),
    ("vb_uuid", "BIGINT"),
    ("snap_start", "BIGINT"),
    ("snap_end", "BIGINT"),
)
COLUMNS = tuple(name for name, _type in COLUMN_TYPES)
SCHEMA_DDL = ", ".join(f"{name} {sql}" for name, sql in COLUMN_TYPES)
