"""`humpty-dumpty`: simulate a producer's rollback decision (spec ``001_f5025b6cebd15e6f.txt``).

    humpty-dumpty FAILOVER_JSON HIGH_SEQNO PURGE_SEQNO < requests

Each stdin line ``UUID SNAP_START SNAP_END START`` is one stream request; the tool prints what
a producer with that failover table, high seqno and purge seqno would answer.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, TextIO

import typer

from dcpkv.core.failover_table import FailoverTable, FailoverTableError
from dcpkv.core.rollback import needs_rollback
from dcpkv.core.seqno import U64_MAX

HELP = (
    "Simulate the rollback decision of a DCP producer.\n\n"
    "Reads stream requests from standard input, one per line: UUID SNAP_START SNAP_END START "
    "(the consumer's vbucket uuid, its snapshot start and end, and the seqno it resumes from). "
    "For each it prints whether a vbucket with the failover table FAILOVER_JSON "
    '([{"id":UUID,"seq":SEQNO}, ...], newest first), HIGH_SEQNO and PURGE_SEQNO would ask that '
    "consumer to roll back, how far, and why.\n\n"
    'Example:  echo "1111 1 4 3" | humpty-dumpty failover.json 10 0'
)

SPEC_FAILOVER = '[{"id":2222,"seq":3},{"id":1111,"seq":0}]'
SPEC_REQUESTS = "1111 1 4 3\n1111 3 3 3\n"


def _u64(text: str, name: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a decimal integer", param_hint=name) from None
    if not 0 <= value <= U64_MAX:
        raise typer.BadParameter(f"{value} is outside 0..2^64-1", param_hint=name)
    return value


def render_table(table: FailoverTable) -> str:
    lines = ["["]
    lines += [f'    {{"id":{e.uuid},"seq":{e.seqno}}}' for e in table]
    lines.append("]")
    return "\n".join(lines)


def simulate(
    table: FailoverTable,
    high_seqno: int,
    purge_seqno: int,
    requests: Iterable[str],
    out: TextIO,
    err: TextIO,
) -> None:
    """Print the header and one answer per well-formed request line."""
    out.write(
        f"Simulating behaviour of VBucket with highSeqno: {high_seqno}, "
        f"purgeSeqno:{purge_seqno}, failoverTable:\n{render_table(table)}\n\n"
    )
    for lineno, line in enumerate(requests, 1):
        fields = line.split()
        if not fields:
            continue
        try:
            if len(fields) != 4:
                raise ValueError(f"expected 4 fields, got {len(fields)}")
            uuid, snap_start, snap_end, start = (_parse_field(f) for f in fields)
        except ValueError as exc:
            err.write(
                f"warning: line {lineno}: skipped {line.strip()!r}: {exc} "
                "(want UUID SNAP_START SNAP_END START)\n"
            )
            continue
        out.write(f"Testing UUID:{uuid} snapshot:{{{snap_start},{snap_end}}} start:{start}\n")
        if not snap_start <= start <= snap_end:
            # A producer answers Erange before it ever reaches the rollback rules.
            out.write("  Erange: the request breaks SNAP_START <= START <= SNAP_END\n")
            continue
        decision = needs_rollback(
            start=start,
            vb_uuid=uuid,
            snap_start=snap_start,
            snap_end=snap_end,
            purge_seqno=purge_seqno,
            failover_table=table,
            high_seqno=high_seqno,
        )
        if decision is None:
            out.write("  Rollback:false\n")
        else:
            out.write(
                "  Rollback:true\n"
                f"  Requested rollback seqno:{decision.seqno}\n"
                f"  Reason: {decision.reason}\n"
            )


def _parse_field(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{text!r} is not a non-negative decimal integer")
    value = int(text)
    if value > U64_MAX:
        raise ValueError(f"{text} is larger than 2^64-1")
    return value


def load_table(path: Path, high_seqno: int) -> FailoverTable:
    """The sanitised table in ``path``; a one-line error and exit 1 when it cannot be read."""
    try:
        return FailoverTable.from_json(path.read_bytes(), high_seqno)
    except OSError as exc:
        message = f"cannot read {path}: {exc.strerror}"
    except FailoverTableError as exc:
        message = f"{path}: {exc}"
    sys.stderr.write(f"humpty-dumpty: error: {message}\n")
    raise typer.Exit(1)


def command(
    failover_json: Annotated[
        Path, typer.Argument(metavar="FAILOVER_JSON", help="The vbucket's failover table.")
    ],
    high_seqno: Annotated[str, typer.Argument(metavar="HIGH_SEQNO", help="Its high seqno.")],
    purge_seqno: Annotated[str, typer.Argument(metavar="PURGE_SEQNO", help="Its purge seqno.")],
) -> None:
    high = _u64(high_seqno, "HIGH_SEQNO")
    purge = _u64(purge_seqno, "PURGE_SEQNO")
    table = load_table(failover_json, high)
    simulate(table, high, purge, sys.stdin, sys.stdout, sys.stderr)


def run_spec_example(out: TextIO = sys.stdout) -> int:
    """The two requests of the spec, against its failover table."""
    out.write(f"$ cat failover.json\n{SPEC_FAILOVER}\n")
    for request in SPEC_REQUESTS.splitlines():
        out.write(f'\n$ echo "{request}" | humpty-dumpty failover.json 10 0\n')
        table = FailoverTable.from_json(SPEC_FAILOVER, 10)
        simulate(table, 10, 0, [request], out, sys.stderr)
    return 0


def main() -> None:
    app = typer.Typer(add_completion=False)
    app.command(help=HELP, no_args_is_help=True)(command)
    app(prog_name="humpty-dumpty")


if __name__ == "__main__":
    main()
