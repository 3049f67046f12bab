"""SASL PLAIN and SCRAM without sockets: against an independent RFC 5802 client (scramp's),
and against hand-built messages for what scramp will not send (the official SDK's nonce)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

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


# -- the official SDK's nonce, and strictness everywhere else ---------------------------------


def _proof(hash_name: str, password: str, server_first: str, auth_message: str) -> bytes:
    """An RFC 5802 client proof, computed here from the RFC, independently of the server."""
    attrs = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        hash_name, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.new(salted, b"Client Key", hash_name).digest()
    stored_key = hashlib.new(hash_name, client_key).digest()
    signature = hmac.new(stored_key, auth_message.encode(), hash_name).digest()
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))


def _exchange(
    session: SaslSession, *, nonce: str, password: str = "password", header: str = "n,,",
    cbind: str = "biws", mech: str = "SCRAM-SHA512", hash_name: str = "sha512",
) -> bytes:  # fmt: skip
    bare = f"n=Administrator,r={nonce}"
    _, first = session.start(mech, f"{header}{bare}".encode())
    server_first = first.decode()
    full_nonce = dict(p.split("=", 1) for p in server_first.split(","))["r"]
    without_proof = f"c={cbind},r={full_nonce}"
    proof = _proof(hash_name, password, server_first, f"{bare},{server_first},{without_proof}")
    final = f"{without_proof},p={base64.b64encode(proof).decode()}"
    return session.step(mech, final.encode())


# Recorded from the couchbase 4.x SDK: hex numbers joined by spaces.
SDK_NONCE = "0x42 0xffffffca 0xffffff8b 0xffffffef 0xfffffff3 0x1c 0x5e 0xffffff88"


@pytest.mark.parametrize(
    ("mech", "hash_name"),
    [("SCRAM-SHA512", "sha512"), ("SCRAM-SHA256", "sha256"), ("SCRAM-SHA1", "sha1")],
)
def test_scram_accepts_the_sdk_nonce_with_spaces(mech: str, hash_name: str) -> None:
    session = SaslSession(USERS)
    final = _exchange(session, nonce=SDK_NONCE, mech=mech, hash_name=hash_name)
    assert final.startswith(b"v=") and session.user == "Administrator"


def test_scram_wrong_password_with_sdk_nonce_fails() -> None:
    session = SaslSession(USERS)
    with pytest.raises(AuthFailed):
        _exchange(session, nonce=SDK_NONCE, password="nope")
    assert session.user is None


@pytest.mark.parametrize(
    "client_first",
    [
        b"p=tls-unique,,n=Administrator,r=abc",  # channel binding we never offered
        b"x,,n=Administrator,r=abc",  # no such GS2 flag
        b"n,a=someone,n=Administrator,r=abc",  # acting as another user
        b"n,,m=ext,n=Administrator,r=abc",  # a mandatory extension
        b"n,,r=abc,n=Administrator",  # attributes out of order
        b"n,,n=Admin=ZZ,r=abc",  # a bad escape
        b"n,,n=Administrator,r=",  # an empty nonce
        b"n,,n=Administrator,r=a\tb",  # a control character in the nonce
        b"n,,n=Administrator,r=ab\xc3\xa9",  # a non-ASCII nonce
        b"n=Administrator,r=abc",  # no GS2 header at all
    ],
)
def test_scram_client_first_is_checked_strictly(client_first: bytes) -> None:
    with pytest.raises(AuthFailed):
        SaslSession(USERS).start("SCRAM-SHA512", client_first)


@pytest.mark.parametrize(
    "change",
    [
        {"cbind": "eSws"},  # binding does not echo the "n,," header
        {"cbind": "biws", "header": "y,,"},  # ... nor the "y,," one
        {"nonce_suffix": "x"},  # not the combined nonce
    ],
)
def test_scram_client_final_is_checked_strictly(change: dict[str, str]) -> None:
    session = SaslSession(USERS)
    header = change.get("header", "n,,")
    _, first = session.start("SCRAM-SHA512", f"{header}n=Administrator,r=abc".encode())
    full_nonce = first.decode().split(",")[0][2:] + change.get("nonce_suffix", "")
    without_proof = f"c={change.get('cbind', 'biws')},r={full_nonce}"
    auth_message = f"n=Administrator,r=abc,{first.decode()},{without_proof}"
    proof = _proof("sha512", "password", first.decode(), auth_message)
    final = f"{without_proof},p={base64.b64encode(proof).decode()}"
    with pytest.raises(AuthFailed):
        session.step("SCRAM-SHA512", final.encode())
    assert session.user is None


def test_scram_y_header_binds_as_esws() -> None:
    session = SaslSession(USERS)
    assert _exchange(session, nonce="abc", header="y,,", cbind="eSws").startswith(b"v=")


def test_scram_unknown_user_looks_like_a_wrong_password() -> None:
    first = SaslSession(USERS).start("SCRAM-SHA512", b"n,,n=ghost,r=abc")[1].decode()
    again = SaslSession(USERS).start("SCRAM-SHA512", b"n,,n=ghost,r=abc")[1].decode()
    assert first.split(",")[1:] == again.split(",")[1:]  # same made-up salt and iterations
    session = SaslSession(USERS)
    session.start("SCRAM-SHA512", b"n,,n=ghost,r=abc")
    with pytest.raises(AuthFailed):
        session.step("SCRAM-SHA512", b"c=biws,r=abcXYZ,p=AAAA")


def test_scram_step_with_another_mechanism_fails() -> None:
    session = SaslSession(USERS)
    session.start("SCRAM-SHA512", b"n,,n=Administrator,r=abc")
    with pytest.raises(AuthFailed):
        session.step("SCRAM-SHA256", b"c=biws,r=abc,p=AAAA")


def test_plain_against_a_users_file_verifier(tmp_path: Path) -> None:
    from dcpkv.core.rbac import USERS_FILE, Role, UserRecord, UsersDoc, save_users

    record = UserRecord.create("ann", "pw", (Role("data_reader", "default"),), iterations=64)
    save_users(tmp_path / USERS_FILE, UsersDoc().with_user(record))
    users = UserStore({"Administrator": "password"}, path=tmp_path / USERS_FILE)
    for _ in range(2):  # the second time from the verified cache
        assert users.check_plain("ann", "pw")
        assert not users.check_plain("ann", "wrong")
    save_users(tmp_path / USERS_FILE, UsersDoc(5, {"ann": record.with_password("new")}))
    users.refresh()  # a changed password forgets what was verified
    assert not users.check_plain("ann", "pw")
    assert users.check_plain("ann", "new")
