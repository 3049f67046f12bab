"""The server side of SCRAM (RFC 5802; SHA-256 per RFC 7677; SHA-512 likewise), sans-I/O.

Why hand-written
----------------
The official Couchbase SDK (PyPI ``couchbase`` 4.x, and the C++ core under it) sends a
client-first nonce that contains spaces. RFC 5802 defines the nonce as printable ASCII from
0x21 to 0x7E except ',' (no space), and ``scramp``, the library this server used before,
enforces that: it refuses the message ("Nonce contains invalid characters"). The client signs
its original message (the nonce is part of the AuthMessage), so a server cannot clean the
nonce either. So this module speaks SCRAM itself, lenient exactly there (a space is accepted)
and strict everywhere else.

Theory of operation
-------------------
One :class:`ScramServer` per exchange::

    client-first  ->  ScramServer.first()  ->  server-first   (SaslAuth, answered AuthContinue)
    client-final  ->  ScramServer.final()  ->  server-final   (SaslStep, answered Success)

``first`` checks the GS2 header (no channel binding: ``n`` or ``y``; ``p=`` is refused since
we offer no ``-PLUS`` mechanism; an authzid must name the user itself), refuses the reserved
``m=`` extension, decodes the user name (``=2C`` and ``=3D`` are the only escapes), and checks
the client nonce: any printable ASCII character but ',' (the leniency the SDK needs). It looks
up the user's :class:`ScramCredentials` and answers ``r=<client nonce><server nonce>,s=<salt>,
i=<iterations>``. An unknown user gets a made-up but stable salt, and the exchange fails only
at ``final``, like a wrong password, so the answer does not tell which users exist.

``final`` checks that the channel binding echoes the GS2 header (``biws`` is base64 of
``n,,``), that the nonce is exactly the combined one, and the proof:
``ClientKey = proof XOR HMAC(StoredKey, AuthMessage)`` must hash to ``StoredKey``
(compared with :func:`hmac.compare_digest`). The answer carries the server signature
``HMAC(ServerKey, AuthMessage)``, which proves to the client that we know the password too.

Credentials (salt, iteration count, StoredKey, ServerKey) are derived with
:func:`hashlib.pbkdf2_hmac`, slow by design, so the caller caches them per user and mechanism
(:class:`dcpkv.server.auth.UserStore`). Passwords are normalised with the mapping and NFKC steps
of SASLprep (RFC 4013), as RFC 5802 asks, which leaves ASCII passwords unchanged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Callable

from dcpkv.core.credentials import (
    DEFAULT_ITERATIONS,
    HASHES,
    SALT_BYTES,
    ScramCredentials,
    new_salt,
    saslprep,
)
from dcpkv.core.errors import DcpkvError

# ScramCredentials, new_salt and saslprep live in core (the CLI and the manager derive
# verifiers too) and are re-exported here, where the exchange uses them.
__all__ = ["HASHES", "ScramCredentials", "ScramError", "ScramServer", "new_salt", "saslprep"]

# RFC 5802's nonce alphabet (0x21-0x7E except ',') plus the space the official SDK sends.
_NONCE_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F)) - {","}
# The GS2 headers we accept, and the base64 the client must echo as channel binding.
_CBIND = {"n": "biws", "y": "eSws"}
# Fake salts for unknown users are keyed by this process-wide secret.
_FAKE_SALT_KEY = secrets.token_bytes(32)


class ScramError(DcpkvError):
    """The exchange failed; the message says why (for the server log only)."""


Lookup = Callable[[str], ScramCredentials | None]


class ScramServer:
    """One SCRAM exchange, server side (see the module docstring)."""

    def __init__(self, mechanism: str, lookup: Lookup, *, server_nonce: str | None = None) -> None:
        hash_name = HASHES.get(mechanism)
        if hash_name is None:
            raise ScramError(f"unsupported SCRAM mechanism {mechanism!r}")
        self.hash_name = hash_name
        self._lookup = lookup
        self._server_nonce = server_nonce or secrets.token_urlsafe(24)
        self._creds: ScramCredentials | None = None
        self._cbind = ""
        self._nonce = ""
        self._auth_prefix = ""
        self.user: str | None = None
        self.authenticated = False

    # -- step 1 ------------------------------------------------------------------------------

    def first(self, client_first: bytes) -> bytes:
        """The client-first message in, the server-first message out."""
        if self._nonce:
            raise ScramError("client-first message sent twice")
        text = _decode(client_first)
        flag, authzid, bare = _split_gs2(text)
        attrs = _attributes(bare)
        if not attrs or attrs[0][0] == "m":
            raise ScramError("mandatory extensions are not supported")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            raise ScramError("client-first-message-bare must start with n=...,r=...")
        user = _saslname(attrs[0][1])
        client_nonce = attrs[1][1]
        if not client_nonce or not set(client_nonce) <= _NONCE_CHARS:
            raise ScramError("client nonce is empty or has non-printable characters")
        if authzid and _saslname(authzid) != user:
            raise ScramError("acting as another user (authzid) is not supported")
        creds = self._lookup(user)
        self._creds = creds
        salt = creds.salt if creds else self._fake_salt(user)
        iterations = creds.iterations if creds else DEFAULT_ITERATIONS
        self.user = user
        self._cbind = _CBIND[flag]
        self._nonce = client_nonce + self._server_nonce
        server_first = f"r={self._nonce},s={_b64(salt)},i={iterations}"
        self._auth_prefix = f"{bare},{server_first}"
        return server_first.encode()

    # -- step 2 ------------------------------------------------------------------------------

    def final(self, client_final: bytes) -> bytes:
        """The client-final message in, the server-final message out (raises if refused)."""
        if not self._nonce or self.authenticated:
            raise ScramError("client-final message out of order")
        text = _decode(client_final)
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise ScramError("client-final message has no proof")
        attrs = _attributes(without_proof)
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise ScramError("client-final-message must start with c=...,r=...")
        if attrs[0][1] != self._cbind:
            raise ScramError("channel binding does not echo the GS2 header")
        if attrs[1][1] != self._nonce:
            raise ScramError("nonce does not match the exchange's")
        auth_message = f"{self._auth_prefix},{without_proof}".encode()
        signature = self._verify(auth_message, _unb64(proof_b64))
        self.authenticated = True
        return f"v={_b64(signature)}".encode()

    def _verify(self, auth_message: bytes, proof: bytes) -> bytes:
        """Check the client proof; the server signature to answer with."""
        creds = self._creds
        if creds is None:
            raise ScramError(f"unknown user {self.user!r}")
        client_signature = _hmac(self.hash_name, creds.stored_key, auth_message)
        if len(proof) != len(client_signature):
            raise ScramError("proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        stored = hashlib.new(self.hash_name, client_key).digest()
        if not hmac.compare_digest(stored, creds.stored_key):
            raise ScramError(f"wrong password for {self.user!r}")
        return _hmac(self.hash_name, creds.server_key, auth_message)

    def _fake_salt(self, user: str) -> bytes:
        # Stable per user, so probing twice cannot tell a made-up salt from a real one.
        key = f"{self.hash_name}:{user}".encode()
        return hmac.new(_FAKE_SALT_KEY, key, "sha256").digest()[:SALT_BYTES]


# -- message syntax ------------------------------------------------------------------------------


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("SCRAM message is not UTF-8") from None


def _split_gs2(text: str) -> tuple[str, str, str]:
    """``(cbind flag, authzid, client-first-message-bare)``."""
    parts = text.split(",", 2)
    if len(parts) != 3:
        raise ScramError("client-first message has no GS2 header")
    flag, authzid, bare = parts
    if flag.startswith("p="):
        raise ScramError("channel binding requested, but no -PLUS mechanism is offered")
    if flag not in _CBIND:
        raise ScramError(f"bad GS2 channel-binding flag {flag!r}")
    if authzid and not authzid.startswith("a="):
        raise ScramError("bad GS2 authzid")
    return flag, authzid[2:], bare


def _attributes(text: str) -> list[tuple[str, str]]:
    """``a=value`` pairs in order; every attribute name is one ASCII letter."""
    out = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=" or not ("a" <= part[0].lower() <= "z"):
            raise ScramError(f"malformed SCRAM attribute {part[:20]!r}")
        out.append((part[0], part[2:]))
    return out


def _saslname(value: str) -> str:
    """Undo the ``=2C``/``=3D`` escapes; any other '=' is an error."""
    if not value:
        raise ScramError("empty user name")
    pieces = value.split("=")
    out = [pieces[0]]
    for piece in pieces[1:]:
        escape = {"2C": ",", "3D": "="}.get(piece[:2])
        if escape is None:
            raise ScramError("bad '=' escape in the user name")
        out.append(escape + piece[2:])
    return "".join(out)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramError("proof is not base64") from None


def _hmac(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()
