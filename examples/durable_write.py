"""Write a document and return only once it is on disk (on a cluster, on replicas too).

    .venv/bin/python examples/durable_write.py order::1 '{"total": 12}'
    .venv/bin/python examples/durable_write.py order::1 '{"total": 12}' --persist-to 2

A write is acknowledged from the active node's memory; ``persist_to=1`` waits until the
active wrote it to disk (ObserveSeqno polling, spec 002), so a kill -9 of the node no longer
loses it. On a cluster, ``--persist-to 2`` waits until a replica has it on disk too, so a
failover of the active does not lose it either; ``--replicate-to N`` waits until N replicas
hold it (in memory). A requirement the bucket cannot meet (more replicas than it has) is
refused before anything is written.
"""

from __future__ import annotations

import asyncio
import sys

from example_options import parser_for, settings_of

from dcpkv.client import (
    ClientSettings,
    ClusterKV,
    DurabilityError,
    DurabilityImpossibleError,
    MutationToken,
)


async def durable_write(
    config: ClientSettings, key: bytes, value: bytes, persist_to: int, replicate_to: int
) -> MutationToken:
    async with await ClusterKV.open(config) as kv:
        return await kv.upsert(key, value, persist_to=persist_to, replicate_to=replicate_to)


def main() -> int:
    parser = parser_for(__doc__)
    parser.add_argument("key")
    parser.add_argument("value")
    parser.add_argument("--persist-to", type=int, default=1, help="nodes with it on disk")
    parser.add_argument("--replicate-to", type=int, default=0, help="replicas holding it")
    args = parser.parse_args()

    config = ClientSettings(settings_of(args), name="example:durable-write")
    write = durable_write(
        config, args.key.encode(), args.value.encode(), args.persist_to, args.replicate_to
    )
    try:
        token = asyncio.run(write)
    except DurabilityImpossibleError as exc:
        print(f"not written: {exc}", file=sys.stderr)
        return 2
    except DurabilityError as exc:  # written, but not (yet) as durable as asked
        print(f"written, durability not confirmed: {exc}", file=sys.stderr)
        return 1
    print(
        f"{args.key} persisted on {args.persist_to} node(s), on {args.replicate_to} replica(s): "
        f"vbucket {token.vbucket} seqno {token.seqno} (branch {token.vbucket_uuid})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
