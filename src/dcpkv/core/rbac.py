"""Users and roles (the shape of Couchbase's RBAC): who may do what, on which bucket.

Theory of operation
-------------------
A user has a name, salted SCRAM verifiers (:mod:`dcpkv.core.credentials`; the password itself
is never stored) and roles. A role is granted on one bucket, or on every bucket (``*``), and
written as Couchbase writes it: ``data_reader[default]``, ``bucket_admin[*]``,
``cluster_admin`` (a cluster role takes no bucket). Each role is a set of privileges:

=====================  =====  =====  ===  ============  =============  ============
role                   read   write  dcp  bucket_admin  cluster_admin  stats_export
=====================  =====  =====  ===  ============  =============  ============
data_reader            yes
data_writer                   yes
data_dcp_reader        yes           yes
bucket_admin           yes    yes    yes  yes
external_stats_reader                                                  yes
cluster_admin          yes    yes    yes  yes           yes            yes
=====================  =====  =====  ===  ============  =============  ============

(``stats_export`` is the manager's ``GET /metrics`` and ``/prometheus_sd_config``: a
Prometheus server's login; ``external_stats_reader`` is a cluster role, like
``cluster_admin``.)

(``dcp_reader`` is accepted for ``data_dcp_reader``.) Any role on a bucket lets a user select
it and read its metadata (stats, seqnos, failover logs, the cluster map); each opcode needs the
privileges the server's dispatch table names. :class:`Grants` answers "may this user do that
on this bucket" with set lookups, fast enough for every request.

The users database is one JSON document, :class:`UsersDoc` (a revision and the users), kept in
a file replaced atomically (:func:`save_users`): on a node, ``users.json`` in its data dir,
written by ``dcpkv user`` or by the cluster manager's push (RbacRefresh); on the manager, in
its own dir. The revision only grows, so a node ignores a delayed push of an older document.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from dcpkv.core.credentials import DEFAULT_ITERATIONS, HASHES, ScramCredentials, derive_all
from dcpkv.core.errors import DcpkvError
from dcpkv.core.files import atomic_write

USERS_FILE = "users.json"
ALL_BUCKETS = "*"


class RbacError(DcpkvError, ValueError):
    """A role, user or users file that cannot be used; the message says why."""


class Privilege(StrEnum):
    READ = "read"
    WRITE = "write"
    DCP = "dcp"
    BUCKET_ADMIN = "bucket_admin"
    CLUSTER_ADMIN = "cluster_admin"
    STATS_EXPORT = "stats_export"  # the manager's Prometheus endpoints


_P = Privilege
ROLE_PRIVILEGES: dict[str, frozenset[Privilege]] = {
    "data_reader": frozenset({_P.READ}),
    "data_writer": frozenset({_P.WRITE}),
    "data_dcp_reader": frozenset({_P.READ, _P.DCP}),
    "bucket_admin": frozenset({_P.READ, _P.WRITE, _P.DCP, _P.BUCKET_ADMIN}),
    "external_stats_reader": frozenset({_P.STATS_EXPORT}),
    "cluster_admin": frozenset(Privilege),
}
ROLE_ALIASES = {"dcp_reader": "data_dcp_reader"}
CLUSTER_ROLES = frozenset({"cluster_admin", "external_stats_reader"})


@dataclass(frozen=True, slots=True, order=True)
class Role:
    name: str
    bucket: str = ALL_BUCKETS

    @classmethod
    def parse(cls, text: str) -> Role:
        """``data_reader[default]``, ``bucket_admin[*]``, ``cluster_admin``."""
        text = text.strip()
        name, sep, rest = text.partition("[")
        name = ROLE_ALIASES.get(name, name)
        if name not in ROLE_PRIVILEGES:
            known = ", ".join(sorted(ROLE_PRIVILEGES))
            raise RbacError(f"unknown role {name!r} (roles: {known})")
        if not sep:
            if name not in CLUSTER_ROLES:
                raise RbacError(f"role {name!r} needs a bucket: {name}[BUCKET] or {name}[*]")
            return cls(name)
        if not rest.endswith("]") or not rest[:-1].strip():
            raise RbacError(f"bad role {text!r}: write {name}[BUCKET]")
        if name in CLUSTER_ROLES:
            raise RbacError(f"role {name!r} is cluster-wide: write it without a bucket")
        return cls(name, rest[:-1].strip())

    def __str__(self) -> str:
        return self.name if self.name in CLUSTER_ROLES else f"{self.name}[{self.bucket}]"


def parse_roles(text: str) -> tuple[Role, ...]:
    """A comma-separated role list (Couchbase's REST syntax); at least one role."""
    roles = tuple(sorted({Role.parse(part) for part in text.split(",") if part.strip()}))
    if not roles:
        raise RbacError("give at least one role, e.g. data_reader[default]")
    return roles


@dataclass(frozen=True, slots=True)
class Grants:
    """What one user may do: privileges per bucket (``*``: every bucket)."""

    by_bucket: dict[str, frozenset[Privilege]]

    @classmethod
    def of(cls, roles: tuple[Role, ...]) -> Grants:
        by_bucket: dict[str, set[Privilege]] = {}
        for role in roles:
            by_bucket.setdefault(role.bucket, set()).update(ROLE_PRIVILEGES[role.name])
        everywhere = by_bucket.get(ALL_BUCKETS, set())
        # Each bucket's set includes what is granted on every bucket: one lookup per request.
        return cls({b: frozenset(p | everywhere) for b, p in by_bucket.items()})

    def can_open(self, bucket: str) -> bool:
        """Any role on ``bucket``: the user may select it and read its metadata."""
        return bucket in self.by_bucket or ALL_BUCKETS in self.by_bucket

    def allows(self, needs: frozenset[Privilege], bucket: str | None) -> bool:
        """Whether ``needs`` are granted on ``bucket`` (None: on every bucket)."""
        have = self.by_bucket.get(bucket or ALL_BUCKETS)
        if have is None:
            have = self.by_bucket.get(ALL_BUCKETS, frozenset())
        return needs <= have


ADMIN_GRANTS = Grants.of((Role("cluster_admin"),))


@dataclass(frozen=True)
class UserRecord:
    name: str
    roles: tuple[Role, ...]
    verifiers: dict[str, ScramCredentials] = field(repr=False)

    @classmethod
    def create(
        cls, name: str, password: str, roles: tuple[Role, ...], iterations: int = DEFAULT_ITERATIONS
    ) -> UserRecord:
        check_user_name(name)
        if not password:
            raise RbacError("the password must not be empty")
        return cls(name, roles, derive_all(password, iterations))

    def with_password(self, password: str) -> UserRecord:
        return UserRecord.create(self.name, password, self.roles)

    def check_password(self, password: str) -> bool:
        verifier = self.verifiers.get("sha512")
        return verifier is not None and verifier.matches("sha512", password)

    def to_json(self) -> dict[str, Any]:
        return {
            "roles": [str(r) for r in self.roles],
            "scram": {h: v.to_json() for h, v in sorted(self.verifiers.items())},
        }

    @classmethod
    def from_json(cls, name: str, doc: Any) -> UserRecord:
        if not isinstance(doc, dict) or not isinstance(doc.get("roles"), list):
            raise RbacError(f"user {name!r}: needs a list of roles")
        scram = doc.get("scram")
        if not isinstance(scram, dict) or set(scram) != set(HASHES.values()):
            raise RbacError(f"user {name!r}: needs a verifier for each of sha1, sha256, sha512")
        try:
            verifiers = {h: ScramCredentials.from_json(v) for h, v in scram.items()}
        except ValueError as exc:
            raise RbacError(f"user {name!r}: {exc}") from None
        return cls(name, parse_roles(",".join(map(str, doc["roles"]))), verifiers)


def check_user_name(name: str) -> None:
    if not name or len(name) > 128 or not name.isprintable() or name != name.strip():
        raise RbacError(f"bad user name {name!r}: 1..128 printable characters, no outer spaces")


@dataclass(frozen=True)
class UsersDoc:
    """The users database: a revision (only grows) and the users by name."""

    rev: int = 0
    users: dict[str, UserRecord] = field(default_factory=dict)

    def with_user(self, user: UserRecord) -> UsersDoc:
        return UsersDoc(self.rev + 1, {**self.users, user.name: user})

    def without(self, name: str) -> UsersDoc:
        if name not in self.users:
            raise RbacError(f"no user named {name!r}")
        return UsersDoc(self.rev + 1, {n: u for n, u in self.users.items() if n != name})

    def encode(self) -> bytes:
        doc = {"rev": self.rev, "users": {n: u.to_json() for n, u in sorted(self.users.items())}}
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str = "the users document") -> UsersDoc:
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RbacError(f"{where} is not JSON: {exc}") from None
        if not isinstance(doc, dict) or type(doc.get("rev")) is not int or doc["rev"] < 0:
            raise RbacError(f"{where}: needs a non-negative integer 'rev'")
        users = doc.get("users")
        if not isinstance(users, dict):
            raise RbacError(f"{where}: needs a 'users' object")
        try:
            records = {name: UserRecord.from_json(name, u) for name, u in users.items()}
        except RbacError as exc:
            raise RbacError(f"{where}: {exc}") from None
        return cls(doc["rev"], records)


def load_users(path: Path) -> UsersDoc:
    """The users file at ``path``; an empty database when there is none."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return UsersDoc()
    except OSError as exc:
        raise RbacError(f"cannot read the users file {path}: {exc.strerror}") from None
    return UsersDoc.decode(raw, str(path))


def save_users(path: Path, doc: UsersDoc) -> None:
    """Replace the users file atomically (a crash leaves the old one or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, doc.encode(), path.with_name(f".{path.name}.tmp"))
    path.chmod(0o600)  # verifiers are not passwords, but a dictionary attack needs them
