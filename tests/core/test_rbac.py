"""Roles, grants, the users document and the login throttle (sans-I/O)."""

from __future__ import annotations

import pytest

from dcpkv.core.rbac import (
    Grants,
    Privilege,
    RbacError,
    Role,
    UserRecord,
    UsersDoc,
    parse_roles,
)
from dcpkv.server.login_throttle import LoginThrottle

R, W, D, B, C = (Privilege.READ, Privilege.WRITE, Privilege.DCP, Privilege.BUCKET_ADMIN,
                 Privilege.CLUSTER_ADMIN)  # fmt: skip

# role, bucket asked about, privilege -> allowed
GRANT_CASES = [
    ("data_reader[b]", "b", R, True),
    ("data_reader[b]", "b", W, False),
    ("data_reader[b]", "b", D, False),
    ("data_reader[b]", "other", R, False),
    ("data_writer[b]", "b", W, True),
    ("data_writer[b]", "b", R, False),
    ("data_dcp_reader[b]", "b", D, True),
    ("data_dcp_reader[b]", "b", R, True),
    ("data_dcp_reader[b]", "b", W, False),
    ("dcp_reader[b]", "b", D, True),
    ("bucket_admin[b]", "b", B, True),
    ("bucket_admin[b]", "b", C, False),
    ("bucket_admin[*]", "any", W, True),
    ("cluster_admin", "any", C, True),
    ("cluster_admin", None, C, True),
    ("data_reader[*]", None, R, True),
    ("data_reader[b]", None, R, False),
]


@pytest.mark.parametrize(("role", "bucket", "privilege", "allowed"), GRANT_CASES)
def test_grants(role: str, bucket: str | None, privilege: Privilege, allowed: bool) -> None:
    grants = Grants.of(parse_roles(role))
    assert grants.allows(frozenset({privilege}), bucket) is allowed


def test_any_role_opens_its_bucket_only() -> None:
    grants = Grants.of(parse_roles("data_writer[b]"))
    assert grants.can_open("b") and not grants.can_open("c")
    assert Grants.of(parse_roles("data_reader[*]")).can_open("c")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("reader[b]", "unknown role"),
        ("data_reader", "needs a bucket"),
        ("data_reader[]", "bad role"),
        ("data_reader[b", "bad role"),
        ("cluster_admin[b]", "cluster-wide"),
        (" , ", "at least one role"),
    ],
)
def test_bad_roles_say_why(text: str, error: str) -> None:
    with pytest.raises(RbacError, match=error):
        parse_roles(text)


def test_role_text_round_trips() -> None:
    roles = parse_roles("cluster_admin, dcp_reader[b],bucket_admin[*]")
    assert [str(r) for r in roles] == ["bucket_admin[*]", "cluster_admin", "data_dcp_reader[b]"]
    assert parse_roles(",".join(map(str, roles))) == roles


def test_users_doc_keeps_verifiers_not_passwords() -> None:
    user = UserRecord.create("ann", "s3cret", (Role("data_reader", "b"),), iterations=64)
    doc = UsersDoc().with_user(user)
    raw = doc.encode()
    assert b"s3cret" not in raw
    back = UsersDoc.decode(raw)
    assert back.rev == 1 and back.users["ann"].roles == user.roles
    assert back.users["ann"].check_password("s3cret")
    assert not back.users["ann"].check_password("s3cre")
    assert back.without("ann").rev == 2


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"nope", "not JSON"),
        (b'{"users": {}}', "rev"),
        (b'{"rev": 1}', "users"),
        (b'{"rev": 1, "users": {"a": {"roles": ["cluster_admin"]}}}', "verifier"),
    ],
)
def test_bad_users_documents_say_why(raw: bytes, error: str) -> None:
    with pytest.raises(RbacError, match=error):
        UsersDoc.decode(raw)


def test_throttle_blocks_after_max_failures_until_the_window_passes() -> None:
    throttle = LoginThrottle(max_failures=3, window_s=10.0)
    for t in (0.0, 1.0, 2.0):
        assert not throttle.blocked("a", t)
        throttle.failed("a", t)
    assert throttle.blocked("a", 3.0)
    assert not throttle.blocked("b", 3.0)  # per address
    assert throttle.blocked("a", 9.9)
    assert not throttle.blocked("a", 10.5)  # the first failure left the window
    assert throttle.throttled == 2


def test_throttle_table_is_bounded() -> None:
    throttle = LoginThrottle(max_failures=1, max_addresses=100)
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}", float(i) / 1000)
    assert len(throttle._failures) <= 100
    assert throttle.blocked("10.0.3.231", 1.0)  # the latest is still remembered
