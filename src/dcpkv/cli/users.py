"""``dcpkv user add|list|remove|passwd``: the users and roles of a node, or of a cluster.

Theory of operation
-------------------
Two places hold users (:mod:`dcpkv.core.rbac`):

* a single node's users file, ``users.json`` in its data dir (``--data-dir``): the commands
  rewrite it atomically, and a running server re-reads it at the next login, so no restart;
* a cluster's manager (``--manager URL``): the commands call its admin API
  (``/settings/rbac/users``, Couchbase's routes) as the cluster admin, and the manager pushes
  the users to every node.

Only salted SCRAM verifiers are stored. A password not given with ``--password`` is asked for
(twice, hidden). Roles are Couchbase's: ``data_reader[BUCKET]``, ``data_writer[BUCKET]``,
``data_dcp_reader[BUCKET]`` (alias ``dcp_reader``), ``bucket_admin[BUCKET]`` (``*``: every
bucket), ``cluster_admin``. The administrators of the server's config are not listed here:
they stay cluster admins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from dcpkv.cli.options import manager_call
from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER

user_app = typer.Typer(
    help="Users and roles: add, list, remove, passwd (a node's data dir, or a cluster's "
    "manager with --manager).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)

DataDir = Annotated[
    Path, typer.Option(help="The node's data dir (its users.json).", envvar="DCPKV_DATA_DIR")
]
Manager = Annotated[
    str | None,
    typer.Option(help="A cluster manager's admin API URL: manage the cluster's users instead."),
]
AdminUser = Annotated[str, typer.Option(help="The cluster admin (with --manager).")]
AdminPassword = Annotated[str, typer.Option(help="Its password (with --manager).")]
Roles = Annotated[
    list[str],
    typer.Option(
        "--role",
        help="A role, repeatable or comma-separated: data_reader[BUCKET], data_writer[BUCKET], "
        "data_dcp_reader[BUCKET], bucket_admin[BUCKET or *], cluster_admin.",
    ),
]
NewPassword = Annotated[
    str, typer.Option(prompt=True, hide_input=True, confirmation_prompt=True, help="Password.")
]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"dcpkv user: {message}", err=True)
    return typer.Exit(1)


def _manager_call(
    url: str, method: str, path: str, user: str, password: str, params: dict[str, str] | None = None
) -> Any:
    return manager_call("user", url, method, path, user, password, params)


def _edit_file(data_dir: Path, change: Any) -> None:
    """Load the users file, apply ``change`` (UsersDoc -> UsersDoc), save it atomically."""
    from dcpkv.core.rbac import USERS_FILE, RbacError, load_users, save_users

    path = data_dir / USERS_FILE
    try:
        save_users(path, change(load_users(path)))
    except RbacError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"cannot write {path}: {exc.strerror}") from None


@user_app.command()
def add(
    name: Annotated[str, typer.Argument(help="The user's name.")],
    role: Roles,
    password: NewPassword,
    data_dir: DataDir = Path("./dcpkv-data"),
    manager: Manager = None,
    admin_user: AdminUser = DEFAULT_USER,
    admin_password: AdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Add a user with roles, or replace an existing user's password and roles."""
    from dcpkv.core.rbac import RbacError, UserRecord, parse_roles

    try:
        roles = parse_roles(",".join(role))
        record = UserRecord.create(name, password, roles)
    except RbacError as exc:
        raise _fail(str(exc)) from None
    if manager is not None:
        params = {"password": password, "roles": ",".join(str(r) for r in roles)}
        _manager_call(manager, "PUT", f"/settings/rbac/users/local/{name}", admin_user,
                      admin_password, params)  # fmt: skip
    else:
        _edit_file(data_dir, lambda doc: doc.with_user(record))
    typer.echo(f"user {name!r}: {', '.join(str(r) for r in roles)}")


@user_app.command("list")
def list_(
    data_dir: DataDir = Path("./dcpkv-data"),
    manager: Manager = None,
    admin_user: AdminUser = DEFAULT_USER,
    admin_password: AdminPassword = DEFAULT_PASSWORD,
    json_: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
) -> None:
    """List the users and their roles (never their verifiers)."""
    from dcpkv.core.rbac import USERS_FILE, RbacError, load_users

    if manager is not None:
        users = _manager_call(manager, "GET", "/settings/rbac/users", admin_user, admin_password)
    else:
        try:
            doc = load_users(data_dir / USERS_FILE)
        except RbacError as exc:
            raise _fail(str(exc)) from None
        users = [{"id": n, "roles": [str(r) for r in u.roles]} for n, u in doc.users.items()]
    if json_:
        typer.echo(json.dumps(users))
        return
    for user in users:
        typer.echo(f"{user['id']}  {', '.join(user['roles'])}")


@user_app.command()
def remove(
    name: Annotated[str, typer.Argument(help="The user to remove.")],
    data_dir: DataDir = Path("./dcpkv-data"),
    manager: Manager = None,
    admin_user: AdminUser = DEFAULT_USER,
    admin_password: AdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Remove a user (its open connections lose their rights at the node's next reload)."""
    if manager is not None:
        path = f"/settings/rbac/users/local/{name}"
        _manager_call(manager, "DELETE", path, admin_user, admin_password)
    else:
        _edit_file(data_dir, lambda doc: doc.without(name))
    typer.echo(f"user {name!r} removed")


@user_app.command()
def passwd(
    name: Annotated[str, typer.Argument(help="The user whose password changes.")],
    password: NewPassword,
    data_dir: DataDir = Path("./dcpkv-data"),
    manager: Manager = None,
    admin_user: AdminUser = DEFAULT_USER,
    admin_password: AdminPassword = DEFAULT_PASSWORD,
) -> None:
    """Change a user's password (its roles stay)."""
    from dcpkv.core.rbac import RbacError, UsersDoc

    if manager is not None:
        path = f"/settings/rbac/users/local/{name}"
        _manager_call(manager, "PUT", path, admin_user, admin_password, {"password": password})
    else:

        def change(doc: UsersDoc) -> UsersDoc:
            held = doc.users.get(name)
            if held is None:
                raise RbacError(f"no user named {name!r}")
            return doc.with_user(held.with_password(password))

        _edit_file(data_dir, change)
    typer.echo(f"password of {name!r} changed")
