"""What a server keeps of a password: salted SCRAM verifiers (RFC 5802), never the password.

Theory of operation
-------------------
For each hash (SHA-1, SHA-256, SHA-512: the mechanisms Couchbase offers) a password becomes a
:class:`ScramCredentials`: a random salt, an iteration count, ``StoredKey = H(HMAC(salted,
"Client Key"))`` and ``ServerKey = HMAC(salted, "Server Key")`` where ``salted`` is PBKDF2 of
the password. That is all a SCRAM server needs to check a proof, and a stolen verifier does not
give the password back (only a slow dictionary attack, one PBKDF2 per guess). A PLAIN login is
checked against the same verifier: the server derives the offered password with the stored
salt and compares StoredKeys in constant time.

Here, in core, because three places derive verifiers: the data server (its SCRAM exchange,
:mod:`dcpkv.server.scram`), the ``dcpkv user`` commands, and the cluster manager (which must
not import the server's code).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass
from typing import Any

# Couchbase spells the mechanisms without the dash after SHA.
HASHES = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}
DEFAULT_ITERATIONS = 4096
SALT_BYTES = 16


@dataclass(frozen=True)
class ScramCredentials:
    """What the server keeps of a password for one hash: never the password itself."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(
        cls, hash_name: str, password: str, salt: bytes, iterations: int = DEFAULT_ITERATIONS
    ) -> ScramCredentials:
        salted = hashlib.pbkdf2_hmac(hash_name, saslprep(password).encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", hash_name).digest()
        return cls(
            salt=salt,
            iterations=iterations,
            stored_key=hashlib.new(hash_name, client_key).digest(),
            server_key=hmac.new(salted, b"Server Key", hash_name).digest(),
        )

    def matches(self, hash_name: str, password: str) -> bool:
        """Whether ``password`` is the one this verifier was made from (a PLAIN login)."""
        other = ScramCredentials.derive(hash_name, password, self.salt, self.iterations)
        return hmac.compare_digest(other.stored_key, self.stored_key)

    def to_json(self) -> dict[str, Any]:
        return {
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "storedKey": _b64(self.stored_key),
            "serverKey": _b64(self.server_key),
        }

    @classmethod
    def from_json(cls, doc: Any) -> ScramCredentials:
        """ValueError when ``doc`` is not a verifier as :meth:`to_json` writes it."""
        if not isinstance(doc, dict):
            raise ValueError("a verifier must be an object")
        iterations = doc.get("iterations")
        if type(iterations) is not int or not 1 <= iterations <= 10_000_000:
            raise ValueError("a verifier needs an iteration count in 1..10000000")
        return cls(
            salt=_unb64(doc.get("salt")),
            iterations=iterations,
            stored_key=_unb64(doc.get("storedKey")),
            server_key=_unb64(doc.get("serverKey")),
        )


def derive_all(password: str, iterations: int = DEFAULT_ITERATIONS) -> dict[str, ScramCredentials]:
    """hash name -> a verifier with its own fresh salt, for every mechanism offered."""
    return {
        h: ScramCredentials.derive(h, password, new_salt(), iterations) for h in HASHES.values()
    }


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ValueError("a verifier field must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a verifier field is not base64") from None


def saslprep(password: str) -> str:
    """SASLprep's mapping and normalisation (RFC 4013 section 2.1-2.2).

    Non-ASCII spaces become spaces and "commonly mapped to nothing" characters go, then NFKC.
    The prohibited-output checks are skipped: the password is the server's own configuration,
    and a client that sends something else simply fails the proof.
    """
    if password.isascii():
        return password
    mapped = "".join(
        " " if stringprep.in_table_c12(ch) else ch
        for ch in password
        if not stringprep.in_table_b1(ch)
    )
    return unicodedata.normalize("NFKC", mapped)


def new_salt() -> bytes:
    return secrets.token_bytes(SALT_BYTES)
