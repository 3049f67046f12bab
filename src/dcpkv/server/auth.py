"""SASL authentication for the data server: PLAIN and SCRAM-SHA1/256/512, sans-I/O.

Theory of operation
-------------------
A connection owns one :class:`SaslSession`. ``SaslAuth`` calls :meth:`SaslSession.start` with
the mechanism name and the client's first message; PLAIN finishes there, SCRAM answers with the
server-first message (the server answers status AuthContinue) and finishes in
:meth:`SaslSession.step` (``SaslStep``), whose answer is the server-final message. Any failure
raises :class:`AuthFailed`; the server answers AuthError and the connection stays
unauthenticated.

The SCRAM exchange is this project's own (:mod:`dcpkv.server.scram`: the official SDK's nonce
is outside what general-purpose SCRAM libraries accept). This module maps mechanism names onto
it and keeps the salted credentials, derived once per user and mechanism since PBKDF2 is slow
by design.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from dcpkv.core.errors import DcpkvError
from dcpkv.core.rbac import ADMIN_GRANTS, Grants, RbacError, UsersDoc, load_users, save_users
from dcpkv.server.scram import HASHES, ScramCredentials, ScramError, ScramServer, new_salt

MECHANISMS = (*HASHES, "PLAIN")
log = logging.getLogger("dcpkv.server")
_VERIFIED_MAX = 4096


class AuthFailed(DcpkvError):
    """Authentication failed; the message says why (for the server log, not the client)."""


@dataclass
class UserStore:
    """The server's users: the configured administrators, and the users file.

    ``passwords`` are the administrators of the server's config (``[users]``, ``--user``):
    cluster admins, as every user was before roles existed, so existing set-ups keep working.
    Their SCRAM credentials are derived on first use (PBKDF2 is slow by design). The users
    file (``users.json`` in the data dir, :mod:`dcpkv.core.rbac`) holds everyone else, with
    their verifiers and roles; it is re-read when it changed on disk (``dcpkv user`` writes
    it, at each login, a ``stat`` call) or when the manager pushes a newer document
    (:meth:`adopt`). A configured administrator's name shadows a file user of the same name.
    """

    passwords: dict[str, str]
    path: Path | None = None
    doc: UsersDoc = field(default_factory=UsersDoc)
    _scram: dict[tuple[str, str], ScramCredentials] = field(default_factory=dict, repr=False)
    # (inode, mtime, size) of the users file last read: each atomic replace makes a new inode,
    # so two writes within one tick of the file system's clock are still told apart
    _stamp: tuple[int, int, int] | None = field(default=None, repr=False)
    _grants: dict[str, Grants] = field(default_factory=dict, repr=False)
    # PLAIN logins already verified, as keyed hashes of (user, password): checking a password
    # against a verifier costs a PBKDF2 (~8 ms) on the event loop, and the official SDK logs
    # in with PLAIN over TLS on every connection. Forgotten whenever the users change.
    _verified: set[bytes] = field(default_factory=set, repr=False)
    _verified_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def __post_init__(self) -> None:
        self._set(self.doc)  # the administrators, with or without a users file
        self.refresh()

    def refresh(self) -> None:
        """Re-read the users file if it changed; a bad file is logged and the old kept."""
        if self.path is None:
            return
        try:
            st = self.path.stat()
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            log.warning("cannot stat the users file %s: %s", self.path, exc)
            return
        else:
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._set(load_users(self.path))
        except RbacError as exc:
            log.error("users file not loaded, keeping the previous users: %s", exc)

    def adopt(self, doc: UsersDoc) -> bool:
        """Keep a pushed document if it is newer than ours (and write it); whether it was."""
        self.refresh()
        if doc.rev <= self.doc.rev:
            return False
        if self.path is not None:
            save_users(self.path, doc)
            st = self.path.stat()
            self._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        self._set(doc)
        return True

    def _set(self, doc: UsersDoc) -> None:
        self.doc = doc
        self._verified.clear()
        self._grants = {name: Grants.of(u.roles) for name, u in doc.users.items()}
        for name in self.passwords:
            self._grants[name] = ADMIN_GRANTS

    def grants(self, user: str | None) -> Grants | None:
        return self._grants.get(user) if user is not None else None

    def check_plain(self, user: str, password: str) -> bool:
        expected = self.passwords.get(user)
        if expected is not None:
            return hmac.compare_digest(expected.encode("utf-8"), password.encode("utf-8"))
        record = self.doc.users.get(user)
        if record is None:
            return False
        token = hmac.new(self._verified_key, f"{user}\0{password}".encode(), "sha256").digest()
        if token in self._verified:
            return True
        if not record.check_password(password):
            return False
        if len(self._verified) >= _VERIFIED_MAX:
            self._verified.clear()
        self._verified.add(token)
        return True

    def scram_credentials(self, hash_name: str, user: str) -> ScramCredentials | None:
        """The user's credentials for one hash (None: no such user)."""
        password = self.passwords.get(user)
        if password is None:
            record = self.doc.users.get(user)
            return record.verifiers.get(hash_name) if record is not None else None
        key = (hash_name, user)
        if key not in self._scram:
            self._scram[key] = ScramCredentials.derive(hash_name, password, new_salt())
        return self._scram[key]


class SaslSession:
    """One connection's authentication exchange."""

    def __init__(self, users: UserStore) -> None:
        self._users = users
        self._scram: ScramServer | None = None
        self._mechanism = ""
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
        hash_name = HASHES.get(mechanism)
        if hash_name is None:
            raise AuthFailed(f"unsupported mechanism {mechanism!r}")
        server = ScramServer(mechanism, lambda user: self._users.scram_credentials(hash_name, user))
        try:
            first = server.first(payload)
        except ScramError as exc:
            raise AuthFailed(f"bad SCRAM client-first message: {exc}") from None
        self._scram, self._mechanism = server, mechanism
        return False, first

    def step(self, mechanism: str, payload: bytes) -> bytes:
        """Finish a SCRAM exchange; the answer is the server-final message."""
        if self._scram is None or mechanism != self._mechanism:
            raise AuthFailed("SaslStep without a SCRAM exchange of that mechanism in progress")
        server, self._scram = self._scram, None
        try:
            final = server.final(payload)
        except ScramError as exc:
            raise AuthFailed(f"SCRAM proof rejected: {exc}") from None
        self.user = server.user
        return final

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
