"""Session opcodes: the gates a connection passes before it may touch data.

Theory of operation
-------------------
A connection moves through three gates: Hello (optional, negotiates features: only those
this server implements are acknowledged; ClustermapChangeNotification only with Duplex, and it
subscribes the connection to the maps of its bucket), SASL (PLAIN or SCRAM,
:mod:`dcpkv.server.auth`), SelectBucket. The dispatcher enforces the gates (Eaccess before
authentication, NoBucket before a bucket is selected); the handlers here move a connection
through them, and answer the opcodes any client may send at any time (Noop, Version, Quit,
GetErrorMap) or once in a bucket (GetClusterConfig).
"""

from __future__ import annotations

import logging
import time
from typing import NoReturn

from dcpkv import __version__
from dcpkv.core import logs
from dcpkv.core.manager_term import term_of
from dcpkv.core.rbac import RbacError, UsersDoc
from dcpkv.core.status import Status
from dcpkv.protocol import kv
from dcpkv.protocol.base import GenericResponse
from dcpkv.protocol.constants import Datatype, HelloFeature
from dcpkv.server import datatype
from dcpkv.server.auth import AuthFailed, SaslSession
from dcpkv.server.connection import (
    SUPPORTED_FEATURES,
    CloseConnection,
    Connection,
    Reply,
    check_term,
)
from dcpkv.server.error_map import error_map_json

_AGENT_MAX = 200  # characters of a Hello agent kept for logs and stats


def ok(req: kv.Request) -> GenericResponse:
    """The empty success answer to ``req``."""
    return GenericResponse(opcode=req.opcode, opaque=req.opaque)


def noop(conn: Connection, req: kv.Noop) -> GenericResponse:
    return ok(req)


def version(conn: Connection, req: kv.Version) -> kv.VersionResponse:
    return kv.VersionResponse(opaque=req.opaque, version=f"dcpkv-{__version__}")


def quit_(conn: Connection, req: kv.Quit) -> None:
    raise CloseConnection(ok(req).encode())


def hello(conn: Connection, req: kv.Hello) -> kv.HelloResponse:
    conn.agent = req.agent[:_AGENT_MAX]
    conn.manager_term = term_of(conn.agent)
    conn.server.saw_term(conn.manager_term)
    conn.features = {HelloFeature(f) for f in req.features if f in SUPPORTED_FEATURES}
    if HelloFeature.Duplex not in conn.features:  # a notification is a server request
        conn.features.discard(HelloFeature.ClustermapChangeNotification)
    conn.datatype_mask = datatype.mask(conn.features)
    if HelloFeature.ClustermapChangeNotification in conn.features:
        conn.server.map_subscribers[id(conn)] = conn
    else:
        conn.server.map_subscribers.pop(id(conn), None)
    return kv.HelloResponse(opaque=req.opaque, features=tuple(sorted(conn.features)))


def sasl_list_mechs(conn: Connection, req: kv.SaslListMechs) -> kv.SaslListMechsResponse:
    mechanisms = SaslSession.list_mechanisms().decode()
    return kv.SaslListMechsResponse(opaque=req.opaque, mechanisms=mechanisms)


def sasl_auth(conn: Connection, req: kv.SaslAuth) -> kv.SaslAuthResponse:
    server = conn.server
    if server.login_throttle.blocked(conn.peer_host, time.monotonic()):
        logs.event(
            server.log,
            "auth_failure",
            "login from %s refused: too many failed logins",
            conn.peer,
            level=logging.WARNING,
            peer=conn.peer_host,
            reason="throttled",
        )
        conn.user = None
        raise Reply(Status.AuthError, b"Too many failed logins from this address; retry later")
    server.users.refresh()  # `dcpkv user` may have changed the users file
    conn.sasl = SaslSession(server.users)
    try:
        done, answer = conn.sasl.start(req.mechanism, bytes(req.data))
    except AuthFailed as exc:
        _refuse_login(conn, exc)
    if not done:
        return kv.SaslAuthResponse(opaque=req.opaque, status=Status.AuthContinue, data=answer)
    conn.authenticated(conn.sasl.user)
    return kv.SaslAuthResponse(opaque=req.opaque, data=b"Authenticated")


def sasl_step(conn: Connection, req: kv.SaslStep) -> kv.SaslStepResponse:
    if conn.sasl is None:
        raise Reply(Status.AuthError)
    try:
        answer = conn.sasl.step(req.mechanism, bytes(req.data))
    except AuthFailed as exc:
        _refuse_login(conn, exc)
    conn.authenticated(conn.sasl.user)
    return kv.SaslStepResponse(opaque=req.opaque, data=answer)


def _refuse_login(conn: Connection, exc: AuthFailed) -> NoReturn:
    logs.event(
        conn.server.log,
        "auth_failure",
        "auth failed from %s: %s",
        conn.peer,
        exc,
        level=logging.WARNING,
        peer=conn.peer_host,
        reason=str(exc),
    )
    conn.server.auth_errors += 1
    conn.server.login_throttle.failed(conn.peer_host, time.monotonic())
    conn.user = None
    raise Reply(Status.AuthError, b"Authentication failed") from None


def select_bucket(conn: Connection, req: kv.SelectBucket) -> GenericResponse:
    grants = conn.server.users.grants(conn.user)
    if grants is None or not grants.can_open(req.bucket):
        # Couchbase's answer too: no role on it, whether or not the bucket exists
        conn.server.eaccess += 1
        raise Reply(Status.Eaccess, f"no role on bucket {req.bucket!r}".encode())
    if req.bucket not in conn.server.buckets:
        raise Reply(Status.KeyEnoent, f"no bucket named {req.bucket!r}".encode())
    conn.bucket_name = req.bucket
    return ok(req)


def get_error_map(conn: Connection, req: kv.GetErrorMap) -> kv.GetErrorMapResponse:
    return kv.GetErrorMapResponse(
        opaque=req.opaque, error_map=error_map_json(req.version), datatype=Datatype.JSON
    )


def set_cluster_config(conn: Connection, req: kv.SetClusterConfig) -> GenericResponse:
    """The manager's map for a bucket (the key, or the selected bucket): kept when its
    (revEpoch, rev) is newer than the one held, ignored when not (a delayed push)."""
    name = req.bucket or conn.bucket_name
    if name is None or name not in conn.server.buckets:
        raise Reply(Status.KeyEnoent, f"no bucket named {name!r}".encode())
    check_term(conn, f"SetClusterConfig {name}")
    try:
        conn.server.set_cluster_config(name, bytes(req.config))
    except ValueError as exc:
        raise Reply(Status.Einval, str(exc).encode()) from None
    return ok(req)


def get_cluster_config(conn: Connection, req: kv.GetClusterConfig) -> kv.GetClusterConfigResponse:
    config = conn.server.cluster_map(conn.bucket_name)
    return kv.GetClusterConfigResponse(opaque=req.opaque, config=config, datatype=Datatype.JSON)


def rbac_refresh(conn: Connection, req: kv.RbacRefresh) -> GenericResponse:
    """A cluster manager's users document: kept (and written to the users file) when its
    revision is newer than the one held, ignored when not (a delayed push)."""
    try:
        doc = UsersDoc.decode(bytes(req.users))
    except RbacError as exc:
        raise Reply(Status.Einval, str(exc).encode()[:1024]) from None
    if conn.server.users.adopt(doc):
        conn.server.log.info("users document rev %d adopted (%d users)", doc.rev, len(doc.users))
    return ok(req)
