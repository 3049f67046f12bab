"""The Redis peer's paced live tail at given rates, for ``bench/latency.py``.

Run by a Python that has ``redis`` and ``hiredis`` (the peer scripts' own needs, often not the
project's venv): ``python _redis_tail.py PEERBENCH_DIR SECONDS RATE...``. For each rate it
starts a private redis-server and calls ``redis_streams.bench_tail`` (the peer script's own
code, imported, not copied) with one batch of ``rate / 1000`` XADDs per millisecond, the same
pacing ``latency.py`` gives dcpkv's writer; prints ``{rate: {rate, p50_us, p99_us, ...}}`` as
JSON. Imports nothing from dcpkv.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile


def main() -> None:
    peerbench, seconds, rates = sys.argv[1], float(sys.argv[2]), [int(r) for r in sys.argv[3:]]
    sys.path.insert(0, peerbench)
    import redis_streams  # the peer script, from its own folder

    out = {}
    workdir = tempfile.mkdtemp(prefix="dcpkv-bench-redis-")
    try:
        for rate in rates:
            batch = max(1, rate // 1000)
            proc, port = redis_streams.start_redis(workdir)
            try:
                out[rate] = redis_streams.bench_tail(
                    port, b"live", int(rate * seconds), batch, rate=rate
                )
            finally:
                redis_streams.stop(proc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
