"""SASL authentication for the data server: PLAIN and SCRAM-SHA1/256/512, sans-I/O.

Theory of operation
-------------------
A connection owns one :class:`SaslSession`. ``SaslAuth`` calls :meth:`SaslSession.start` with
the mechanism name and the client's first message; PLAIN finishes there, SCRAM answers with the
server-first message (the server answers status AuthContinue) and finishes in
:meth:`SaslSession.step` (``SaslStep``), whose answer is the server-final message. Any failure
raises :class:`AuthFailed`; the server answers AuthError and the connection stays
unauthenticated.

The SCRAM exchange itself is the ``scramp`` library's (a well-kept implementation of RFC 5802
and RFC 7677); this module only maps Couchbase's mechanism names onto it and keeps the salted
credentials, which are derived once per user and mechanism since PBKDF2 is slow by design.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any

import scramp

# Couchbase spells the SCRAM mechanisms without the dash after SHA.
SCRAM_MECHANISMS = {
    "SCRAM-SHA512": "SCRAM-SHA-512",
    "SCRAM-SHA256": "SCRAM-SHA-256",
    "SCRAM-SHA1": "SCRAM-SHA-1",
}
MECHANISMS = (*SCRAM_MECHANISMS, "PLAIN")
SCRAM_ITERATIONS = 4096


class AuthFailed(Exception):
    """Authentication failed; the message says why (for the server log, not the client)."""


@dataclass
class UserStore:
    """Users and passwords of one server, with SCRAM credentials derived on first use."""

    passwords: dict[str, str]
    _scram: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict, repr=False)

    def check_plain(self, user: str, password: str) -> bool:
        expected = self.passwords.get(user)
        return expected is not None and hmac.compare_digest(
            expected.encode("utf-8"), password.encode("utf-8")
        )

    def scram_auth_info(self, mechanism: scramp.ScramMechanism, user: str) -> tuple[Any, ...]:
        password = self.passwords.get(user)
        if password is None:
            raise AuthFailed(f"unknown user {user!r}")
        key = (mechanism.name, user)
        if key not in self._scram:
            self._scram[key] = mechanism.make_auth_info(password, iteration_count=SCRAM_ITERATIONS)
        return self._scram[key]


class SaslSession:
    """One connection's authentication exchange."""

    def __init__(self, users: UserStore) -> None:
        self._users = users
        self._scram: Any = None
        self.user: str | None = None

    @staticmethod
    def list_mechanisms() -> bytes:
        return " ".join(MECHANISMS).encode()

    def start(self, mechanism: str, payload: bytes) -> tuple[bool, bytes]:
        """Begin an exchange: ``(done, answer)``; not done means the client must step."""
        self.user = None
        self._scram = None
        if mechanism == "PLAIN":
            return True, self._plain(payload)
        scram_name = SCRAM_MECHANISMS.get(mechanism)
        if scram_name is None:
            raise AuthFailed(f"unsupported mechanism {mechanism!r}")
        mech = scramp.ScramMechanism(scram_name)
        server = mech.make_server(lambda user: self._users.scram_auth_info(mech, user))
        try:
            server.set_client_first(payload.decode("utf-8"))
            first = server.get_server_first()
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise AuthFailed(f"bad SCRAM client-first message: {exc}") from None
        self._scram = server
        return False, first.encode()

    def step(self, mechanism: str, payload: bytes) -> bytes:
        """Finish a SCRAM exchange; the answer is the server-final message."""
        if self._scram is None or SCRAM_MECHANISMS.get(mechanism) is None:
            raise AuthFailed("SaslStep without a SCRAM exchange in progress")
        server, self._scram = self._scram, None
        try:
            server.set_client_final(payload.decode("utf-8"))
            final = server.get_server_final()
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise AuthFailed(f"SCRAM proof rejected: {exc}") from None
        self.user = _scram_username(server)
        return final.encode()

    def _plain(self, payload: bytes) -> bytes:
        # authzid \0 authcid \0 password
        parts = payload.split(b"\0")
        if len(parts) != 3:
            raise AuthFailed("PLAIN payload is not authzid\\0user\\0password")
        try:
            user, password = parts[1].decode("utf-8"), parts[2].decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("PLAIN credentials are not UTF-8") from None
        if not self._users.check_plain(user, password):
            raise AuthFailed(f"wrong user or password for {user!r}")
        self.user = user
        return b""


def _scram_username(server: Any) -> str:
    # scramp keeps the client-first-bare message ("n=user,r=nonce"); the user is its n= field.
    for part in server.client_first_bare.split(","):
        if part.startswith("n="):
            return part[2:].replace("=2C", ",").replace("=3D", "=")
    raise AuthFailed("SCRAM exchange carried no user name")
