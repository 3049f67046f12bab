"""The command-line options every example takes: where the node is, and who logs in."""

from __future__ import annotations

import argparse

from dcpkv.client import ConnectionSettings


def parser_for(doc: str) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, with ``--connect``, ``--user`` and
    ``--password`` (the server's defaults)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(
        "--connect",
        default="couchbase://127.0.0.1:11210",
        help="a node, or the nodes of a cluster: couchbase://h1,h2:11210",
    )
    parser.add_argument("--user", default="Administrator")
    parser.add_argument("--password", default="password")
    return parser


def settings_of(args: argparse.Namespace) -> ConnectionSettings:
    return ConnectionSettings.parse(args.connect, user=args.user, password=args.password)
