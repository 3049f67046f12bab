"""The memory quota over the wire: a real server with a 1 MB quota.

Two situations. When the flusher cannot keep up, nothing in memory may be dropped (an
unpersisted value is the only copy), so a write over the quota answers Etmpfail and stores
nothing. When it does keep up, persisted values are ejected to make room, and reading them
fetches them back from disk.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.protocol.constants import HelloFeature
from support.kvclient import KVClient, poll_rounds, write_keys
from support.serverproc import ServerProcess

QUOTA_MB = 1
VALUE_SIZE = 100 * 1024
MAX_WRITES = 40  # 4 MB: four quotas' worth


def value_of(i: int) -> bytes:
    return (b"%06d" % i) * (VALUE_SIZE // 6)


def test_over_quota_with_nothing_to_free_is_tmpfail(server_factory: type, tmp_path: Path) -> None:
    # The flusher never runs (an hour between flushes): every value is unpersisted.
    config = tmp_path / "slow-flusher.toml"
    config.write_text("flush_interval_s = 3600.0\n")
    srv: ServerProcess = server_factory(
        tmp_path / "data", tmp_path / "log", "--memory-quota-mb", str(QUOTA_MB),
        "--config", str(config),
    )  # fmt: skip
    srv.start()
    with KVClient(srv.port) as c:
        c.login()
        stored: list[int] = []
        refused = None
        for i in range(MAX_WRITES):
            status = c.set(b"k%d" % i, value_of(i)).status
            if status == Status.Etmpfail:
                refused = i
                break
            assert status == Status.Success
            stored.append(i)
        assert refused is not None, "4 MB of unpersisted writes fit in a 1 MB quota"
        assert 0 < len(stored) * VALUE_SIZE <= QUOTA_MB * 1024 * 1024
        assert c.get(b"k%d" % refused).status == Status.KeyEnoent
        for i in stored:  # nothing acknowledged was dropped to make room
            assert c.get(b"k%d" % i).value == value_of(i)
        stats = c.stats()
        assert int(stats["mem_used"]) <= int(stats["ep_max_size"])
    # The clean shutdown persists what the quota held back from the flusher.
    assert srv.terminate() == 0


def write_until_accepted(c: KVClient, key: bytes, value: bytes) -> None:
    """Set, retrying Etmpfail while the flusher catches up (as a client should)."""
    for _ in poll_rounds(pause_s=0.01):
        status = c.set(key, value).status
        if status != Status.Etmpfail:
            assert status == Status.Success, Status(status)
            return
    raise AssertionError(f"{key!r} was refused until the time limit")


def test_ejected_values_are_read_back_from_disk(server_factory: type, tmp_path: Path) -> None:
    srv: ServerProcess = server_factory(
        tmp_path / "data", tmp_path / "log", "--memory-quota-mb", str(QUOTA_MB)
    )
    srv.start()
    with KVClient(srv.port) as c:
        c.login()
        c.hello(HelloFeature.MutationSeqno)
        for i in range(MAX_WRITES):
            write_until_accepted(c, b"k%d" % i, value_of(i))
        stats = c.stats()
        used, quota = int(stats["mem_used"]), int(stats["ep_max_size"])
        assert used <= quota < MAX_WRITES * VALUE_SIZE  # so most values were ejected
        for i in range(MAX_WRITES):
            got = c.get(b"k%d" % i)
            assert (got.status, got.value) == (Status.Success, value_of(i))
            assert struct.unpack(">I", got.extras) == (0,)


# The quota bounds the process: while a client writes four quotas' worth, the server's RSS
# grows by at most RSS_MARGIN x the quota plus RSS_SLACK_MB of fixed costs that do not scale
# with the data (the storage's cache and write buffers, the allocator's arenas, socket buffers). The
# same figures are stated in docs/server.md.
RSS_QUOTA_MB = 8
RSS_MARGIN = 1.25
RSS_SLACK_MB = 16
MIB = 1024 * 1024


def _proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def write_past_quota(c: KVClient, total_bytes: int, value: bytes) -> tuple[int, bool]:
    """Write ``total_bytes`` of distinct keys, retrying Etmpfail as a client should, until
    done or refused for a whole polling window; (keys accepted, whether refused for good)."""
    keys = [b"rss-%012d" % i for i in range(total_bytes // len(value))]
    accepted, refused = write_keys(c, keys, value, batch=200, window_s=5.0)
    return accepted, bool(refused)


@pytest.mark.parametrize(
    ("value_size", "policy"),
    [(100, "valueOnly"), (4096, "valueOnly"), (100, "fullEviction")],
    ids=["small-values", "4KiB-values", "small-values-full-eviction"],
)
def test_rss_growth_stays_within_the_quota_margin(
    server_factory: type, tmp_path: Path, value_size: int, policy: str
) -> None:
    srv: ServerProcess = server_factory(
        tmp_path / "data", tmp_path / "log", "--memory-quota-mb", str(RSS_QUOTA_MB),
        "--eviction-policy", policy,
    )  # fmt: skip
    srv.start()
    with KVClient(srv.port, timeout=60) as c:
        c.login()
        pid = int(c.stats()["pid"])
        assert pid == srv.proc.pid  # type: ignore[union-attr]
        base_kib = _proc_kib(pid, "VmRSS")
        value = b"r" * value_size
        accepted, full = write_past_quota(c, 4 * RSS_QUOTA_MB * MIB, value)
        peak_kib = _proc_kib(pid, "VmHWM")  # the kernel's high-water mark: no peak is missed
    if value_size > 1000 or policy == "fullEviction":
        # ejecting persisted values, or evicting persisted items whole, makes room: the whole
        # four quotas are accepted
        assert not full and accepted == 4 * RSS_QUOTA_MB * MIB // value_size
    else:
        # small items are mostly key and metadata, which stay resident: the bucket fills up
        # and refuses, rather than growing past its quota
        assert full
    growth_mb = (peak_kib - base_kib) / 1024
    assert growth_mb <= RSS_QUOTA_MB * RSS_MARGIN + RSS_SLACK_MB, (
        f"RSS grew {growth_mb:.1f} MiB under a {RSS_QUOTA_MB} MiB quota"
    )
