"""TLS contexts (stdlib :mod:`ssl`), the one place their settings are chosen.

Theory of operation
-------------------
The data server's second port (Couchbase's 11207 convention), the cluster manager's HTTP API,
and every client (the client library, the commands, the Spark source, the manager's links to
its nodes) build their contexts here, so all agree: TLS 1.2 at least, the platform's default
ciphers.

* :func:`server_context`: the certificate chain and key; with a CA file, client certificates
  are required and must chain to it (mutual TLS; the user still logs in with SASL, the
  certificate only admits the connection).
* :class:`TlsSettings`: a client's choice, plain data (picklable: Spark ships settings to its
  executors, and an ``SSLContext`` does not pickle); :meth:`TlsSettings.context` builds the
  context where it is used. ``ca`` is the file of certificates to trust (the system's when
  None); ``verify=False`` skips verification (development only: it gives up the protection
  against a man in the middle); ``cert``/``key`` present a client certificate.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from dcpkv.core.errors import DcpkvError


class TlsError(DcpkvError, ValueError):
    """A certificate, key or CA file that cannot be used; the message names it."""


def server_context(cert: Path, key: Path, ca: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert, key)
    if ca is not None:
        _load_ca(ctx, ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """A client's TLS choice: ``ca``, the file of certificates to trust (None: the system's);
    ``verify=False`` skips verifying the server (development only); ``cert``/``key``, a client
    certificate for a server that requires one. Plain data: :meth:`context` builds the
    ``ssl.SSLContext`` (TLS 1.2 at least) where it is used."""

    ca: str | None = None
    verify: bool = True
    cert: str | None = None
    key: str | None = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca is not None:
            _load_ca(ctx, Path(self.ca))
        else:
            ctx.load_default_certs()
        if self.cert is not None:
            _load_chain(ctx, Path(self.cert), Path(self.key) if self.key else None)
        return ctx


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path | None) -> None:
    try:
        ctx.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise TlsError(f"no such certificate or key file: {exc.filename}") from None
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(f"cannot use certificate {cert} with key {key}: {exc}") from None


def _load_ca(ctx: ssl.SSLContext, ca: Path) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except FileNotFoundError:
        raise TlsError(f"no such CA file: {ca}") from None
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(f"cannot use CA file {ca}: {exc}") from None
