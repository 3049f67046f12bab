"""Print a bucket's changes, one line each, and resume where the last run stopped.

    .venv/bin/python examples/stream_changes.py               # follows until Ctrl-C
    .venv/bin/python examples/stream_changes.py --until-now   # stops once caught up

The consumer's offsets (every vbucket's branch, seqno and snapshot) are saved to a file
(``--offsets``, default ``stream.offsets.json``) every second and when the script stops. The
next run starts right after the last change saved: a change is printed twice only if a run
was killed (kill -9) between printing it and saving.

A ``rollback`` line means the server lost changes this consumer had already printed (it was
killed with writes not yet on disk, or a node failed over): everything the line's vbucket
printed above that seqno is gone; what the server holds instead follows.
"""

from __future__ import annotations

import signal
import time

from example_options import parser_for, settings_of

from dcpkv.client import (
    ClientSettings,
    Deletion,
    Event,
    Expiration,
    Mutation,
    Offsets,
    Rollback,
    SyncConsumer,
)

SAVE_EVERY_S = 1.0


def describe(event: Event) -> str | None:
    """One line for a change or a rollback; None for the stream's bookkeeping events."""
    if isinstance(event, Mutation):
        value = event.value.decode(errors="replace")
        return f"mutation vb={event.vbucket} seqno={event.seqno} key={event.key.decode()} {value}"
    if isinstance(event, Deletion | Expiration):
        kind = "deletion" if isinstance(event, Deletion) else "expiration"
        return f"{kind} vb={event.vbucket} seqno={event.seqno} key={event.key.decode()}"
    if isinstance(event, Rollback):
        return f"rollback vb={event.vbucket} to seqno={event.rollback_seqno}"
    return None


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--offsets", default="stream.offsets.json")
    parser.add_argument("--until-now", action="store_true", help="stop once caught up")
    args = parser.parse_args()

    config = ClientSettings(settings_of(args), name="example:stream-changes")
    offsets = Offsets.load_or_new(args.offsets)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill PID: as Ctrl-C
    saved_at = time.monotonic()
    with SyncConsumer(config, offsets=offsets) as consumer:
        try:
            for event in consumer.stream(end="now" if args.until_now else "forever"):
                line = describe(event)
                if line is not None:
                    print(line, flush=True)
                if time.monotonic() - saved_at >= SAVE_EVERY_S:
                    offsets.save(args.offsets)  # right after the event just printed
                    saved_at = time.monotonic()
        except KeyboardInterrupt:
            pass
        finally:
            offsets.save(args.offsets)


if __name__ == "__main__":
    main()
