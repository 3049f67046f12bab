"""The client side of SASL: SCRAM-SHA512 (RFC 5802 with SHA-512) and PLAIN, sans-I/O.

Theory of operation
-------------------
:class:`ScramClient` produces the two messages a client sends and checks the server's final
one::

    first()              -> client-first  (SaslAuth "SCRAM-SHA512", answered AuthContinue)
    final(server_first)  -> client-final  (SaslStep, answered Success with server-final)
    verify(server_final)    the server proved it knows the password too

SCRAM is the default: the password never crosses the wire, and the server authenticates itself
to the client. PLAIN (``plain_payload``) is kept for servers that offer nothing else; it sends
the password in clear, acceptable on loopback only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import unicodedata

from dcpkv.core.errors import DcpkvError

SCRAM_MECHANISM = "SCRAM-SHA512"
_HASH = "sha512"


class SaslError(DcpkvError):
    """The server's SCRAM messages are malformed, or it failed to prove the password."""


def plain_payload(user: str, password: str) -> bytes:
    return f"\0{user}\0{password}".encode()


def _attrs(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        name, sep, value = part.partition("=")
        if not sep or len(name) != 1:
            raise SaslError(f"malformed SCRAM attribute {part!r}")
        out[name] = value
    return out


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, _HASH).digest()


class ScramClient:
    """One SCRAM-SHA512 exchange (see the module docstring)."""

    def __init__(self, user: str, password: str, *, nonce: str | None = None) -> None:
        # RFC 5802 escapes ',' and '=' in the user name; SASLprep of an ASCII password is a no-op,
        # NFKC covers the common non-ASCII cases.
        name = user.replace("=", "=3D").replace(",", "=2C")
        self._password = unicodedata.normalize("NFKC", password).encode()
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._bare = f"n={name},r={self._nonce}"
        self._server_key = b""
        self._auth_message = b""

    def first(self) -> bytes:
        return ("n,," + self._bare).encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs = _attrs(text)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslError("the server's nonce does not extend ours")
        if salt is None or not iterations.isdigit():
            raise SaslError("the server-first message lacks a salt or an iteration count")
        salted = hashlib.pbkdf2_hmac(_HASH, self._password, base64.b64decode(salt), int(iterations))
        client_key = _hmac(salted, b"Client Key")
        stored_key = hashlib.new(_HASH, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        self._auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = _hmac(stored_key, self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_key = _hmac(salted, b"Server Key")
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = _attrs(server_final.decode())
        if "e" in attrs:
            raise SaslError(f"the server refused the exchange: {attrs['e']}")
        expected = base64.b64encode(_hmac(self._server_key, self._auth_message)).decode()
        if not hmac.compare_digest(attrs.get("v", ""), expected):
            raise SaslError("the server's signature is wrong: it does not know the password")
