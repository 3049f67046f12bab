"""The real PyPI client ``python-binary-memcached`` against a real server subprocess."""

from __future__ import annotations

import pytest

from support.serverproc import ServerProcess

bmemcached = pytest.importorskip("bmemcached")


def test_bmemcached_set_get_delete_incr(server: ServerProcess) -> None:
    client = bmemcached.Client((f"127.0.0.1:{server.port}",), "Administrator", "password")
    try:
        assert client.set("greeting", "hello")
        assert client.get("greeting") == "hello"
        assert client.set_multi({"a": "1", "b": "2"}) is not False
        assert client.get_multi(["a", "b", "missing"]) == {"a": "1", "b": "2"}
        assert client.add("greeting", "again") is False
        assert client.replace("greeting", "bye")
        assert client.get("greeting") == "bye"
        assert client.delete("greeting")
        assert client.get("greeting") is None
        assert client.set("n", 10)
        assert client.incr("n", 5) == 15
        assert client.decr("n", 20) == 0
    finally:
        client.disconnect_all()


def test_bmemcached_wrong_password_is_refused(server: ServerProcess) -> None:
    client = bmemcached.Client((f"127.0.0.1:{server.port}",), "Administrator", "nope")
    try:
        # AuthError (0x20), which this client reports as a generic failure with the code
        with pytest.raises(bmemcached.exceptions.MemcachedException, match="Code: 32"):
            client.set("k", "v")
    finally:
        client.disconnect_all()
