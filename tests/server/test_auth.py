"""SASL PLAIN and SCRAM against a real SCRAM client (scramp's), without sockets."""

from __future__ import annotations

import pytest
import scramp

from dcpkv.server.auth import AuthFailed, SaslSession, UserStore

USERS = UserStore({"Administrator": "password", "a,b=c": "pässword"})


def test_mechanisms_listed_strongest_first() -> None:
    assert SaslSession.list_mechanisms() == b"SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN"


def test_plain_accepts_the_right_password_only() -> None:
    session = SaslSession(USERS)
    assert session.start("PLAIN", b"\0Administrator\0password") == (True, b"")
    assert session.user == "Administrator"
    with pytest.raises(AuthFailed):
        session.start("PLAIN", b"\0Administrator\0wrong")
    assert session.user is None
    with pytest.raises(AuthFailed):
        session.start("PLAIN", b"Administrator:password")


@pytest.mark.parametrize(
    ("cb_name", "rfc_name"),
    [
        ("SCRAM-SHA512", "SCRAM-SHA-512"),
        ("SCRAM-SHA256", "SCRAM-SHA-256"),
        ("SCRAM-SHA1", "SCRAM-SHA-1"),
    ],
)
@pytest.mark.parametrize("user", ["Administrator", "a,b=c"])
def test_scram_round_trip(cb_name: str, rfc_name: str, user: str) -> None:
    client = scramp.ScramClient([rfc_name], user, USERS.passwords[user])
    session = SaslSession(USERS)
    done, server_first = session.start(cb_name, client.get_client_first().encode())
    assert not done
    client.set_server_first(server_first.decode())
    final = session.step(cb_name, client.get_client_final().encode())
    client.set_server_final(final.decode())  # raises if the server's signature is wrong
    assert session.user == user


def test_scram_wrong_password_fails_at_the_step() -> None:
    client = scramp.ScramClient(["SCRAM-SHA-512"], "Administrator", "nope")
    session = SaslSession(USERS)
    _, first = session.start("SCRAM-SHA512", client.get_client_first().encode())
    client.set_server_first(first.decode())
    with pytest.raises(AuthFailed):
        session.step("SCRAM-SHA512", client.get_client_final().encode())
    assert session.user is None


@pytest.mark.parametrize(
    ("mech", "payload"),
    [("CRAM-MD5", b"x"), ("SCRAM-SHA512", b"garbage"), ("SCRAM-SHA512", b"\xff\xfe")],
)
def test_bad_starts_fail_cleanly(mech: str, payload: bytes) -> None:
    with pytest.raises(AuthFailed):
        SaslSession(USERS).start(mech, payload)


def test_step_without_start_fails() -> None:
    with pytest.raises(AuthFailed):
        SaslSession(USERS).step("SCRAM-SHA512", b"c=biws,r=x,p=y")
