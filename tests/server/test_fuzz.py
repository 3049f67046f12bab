"""Fuzzing the server's protocol handling (issue 17, item 6) over real sockets.

One server with two buckets: ``default``, which a healthy client uses, and ``fuzz``, which
the fuzzer's logged-in connections select (so the admin opcodes it sends, SetVbucket, Flush,
takeover streams..., change only ``fuzz``). Each example sends hypothesis-made frames on a
fresh connection that is either not logged in, logged in, or opened as a DCP producer: every
opcode, with random extras, keys, values, header fields and framing extras, sometimes with a
byte of the header flipped or the stream cut short, sometimes plain garbage. Then the healthy
client writes and reads back a document. The server must never die, never answer the healthy
client wrongly, and keep its memory bounded.

``DCPKV_FUZZ_EXAMPLES`` sets the number of examples (a short seeded run in ``make test``; the
chaos target runs a long one).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from test_limits import rss

from dcpkv.core.status import Status
from dcpkv.protocol.constants import Magic
from dcpkv.protocol.frame import encode_frame
from support.kvclient import KVClient
from support.serverproc import ServerProcess, tracked_servers

EXAMPLES = int(os.environ.get("DCPKV_FUZZ_EXAMPLES", "120"))
MIB = 1 << 20
MAGICS = [Magic.ClientRequest, Magic.AltClientRequest, Magic.ClientResponse, Magic.ServerRequest]


# Every message type of the codec, with random fields: requests that decode, so the fuzz
# reaches the handlers (the protocol tests' strategies, shared by path: tests are not a package)
from support.protocol_samples import ALL_TYPES, strategy_for  # noqa: E402

TYPED = st.sampled_from(ALL_TYPES).flatmap(strategy_for).map(lambda message: message.encode())


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    # mostly frames that parse, so one bad frame (which closes the connection) does not end
    # every example early
    kind = draw(st.sampled_from(["typed"] * 5 + ["frame"] * 2 + ["flipped", "garbage"]))
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=200))
    if kind == "typed":
        return draw(TYPED)
    magic = draw(st.sampled_from(MAGICS))
    flexible = magic in (Magic.ClientRequest, Magic.ClientResponse)  # those have a flex twin
    framing = [b"", b"", b"\x22\x00\x07", b"\x00"] if flexible else [b""]
    data = encode_frame(
        magic,
        draw(st.integers(0, 0xFF)),
        key=draw(st.binary(max_size=60)),
        extras=draw(st.binary(max_size=48)),
        value=draw(st.binary(max_size=600)),
        vbucket=draw(st.integers(0, 0xFFFF)),
        opaque=draw(st.integers(0, 0xFFFFFFFF)),
        cas=draw(st.integers(0, 2**64 - 1)),
        datatype=draw(st.integers(0, 0xFF)),
        framing_extras=draw(st.sampled_from(framing)),
    )
    if kind == "flipped":
        at = draw(st.integers(0, min(23, len(data) - 1)))
        data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 0xFF))]) + data[at + 1 :]
    return data


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("fuzz")
    config = root / "server.toml"
    config.write_text(
        "[buckets.default]\nvbuckets = 16\n[buckets.fuzz]\nvbuckets = 16\nmemory_quota_mb = 64\n"
    )
    with tracked_servers() as factory:
        server = factory(root / "data", root / "server.log", "--config", str(config))
        server.start()
        yield server


def login(sock: socket.socket, bucket: bytes) -> None:
    for opcode, key, value in ((0x21, b"PLAIN", b"\0Administrator\0password"), (0x89, bucket, b"")):
        sock.sendall(encode_frame(Magic.ClientRequest, opcode, key=key, value=value))
        head = recv_exact(sock, 24)
        recv_exact(sock, struct.unpack(">I", head[8:12])[0])
        assert struct.unpack(">H", head[6:8])[0] == Status.Success


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def dcp_open(sock: socket.socket) -> None:
    extras = struct.pack(">II", 0, 1)  # seqno 0, flags Producer
    sock.sendall(encode_frame(Magic.ClientRequest, 0x50, key=b"fuzz-dcp", extras=extras))
    head = recv_exact(sock, 24)
    recv_exact(sock, struct.unpack(">I", head[8:12])[0])


def drain(sock: socket.socket) -> None:
    """Read what the server answers for a moment (it may also have closed on us)."""
    sock.settimeout(0.02)
    with contextlib.suppress(OSError):
        while sock.recv(1 << 16):
            pass


def healthy_round_trip(port: int, n: int) -> None:
    with KVClient(port) as kv:
        assert kv.login().status == Status.Success
        key, value = b"healthy-%d" % n, b"value-%d" % n
        assert kv.set(key, value).status == Status.Success
        got = kv.get(key)
        assert (got.status, got.value) == (Status.Success, value)


def test_fuzzed_frames_never_hurt_the_server_or_other_clients(fuzzed: ServerProcess) -> None:
    healthy_round_trip(fuzzed.port, 0)
    start_rss = rss(fuzzed)
    counter = iter(range(1, 1 << 30))

    @seed(20261123)
    @settings(
        max_examples=EXAMPLES, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )  # fmt: skip
    @given(st.sampled_from(["anonymous", "logged-in", "dcp"]), st.lists(frames(), max_size=12))
    def one(mode: str, sent: list[bytes]) -> None:
        # Each example from its own loopback address: fuzzed SaslAuth frames are failed
        # logins, and 5 from one address in 10 s throttle its logins (ours and the healthy
        # client's on 127.0.0.1), depending on the machine's speed
        n = next(counter)
        source = (f"127.{1 + n // 62500 % 250}.{n // 250 % 250}.{2 + n % 250}", 0)
        with socket.create_connection(
            ("127.0.0.1", fuzzed.port), timeout=5, source_address=source
        ) as sock:
            if mode != "anonymous":
                login(sock, b"fuzz")
            if mode == "dcp":
                dcp_open(sock)
            with contextlib.suppress(OSError):  # the server closed on a bad frame: allowed
                sock.sendall(b"".join(sent))
            drain(sock)
        assert fuzzed.proc is not None and fuzzed.proc.poll() is None, fuzzed.log()[-2000:]
        healthy_round_trip(fuzzed.port, n)

    one()
    assert rss(fuzzed) < start_rss + 64 * MIB
    # A handler that raises is answered Einternal and logged (survivable, but a bug)
    crashes = [line for line in fuzzed.log().splitlines() if "handler for opcode" in line]
    assert not crashes, crashes[:5]
