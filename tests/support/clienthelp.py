"""What the client's wire tests share: the bucket's vbucket count and a key's vbucket, and the
blocking writer (``tests/server/kvclient.py``). A module of its own name, not the conftest:
several test folders' conftests are loaded in one session, and only one can be ``conftest``."""

from __future__ import annotations

from dcpkv.core.vbucket import vbucket_for_key
from support.kvclient import Writer

VBUCKETS = 16  # serverproc starts every server with --vbuckets 16
__all__ = ["VBUCKETS", "Writer", "vb_of"]


def vb_of(key: bytes) -> int:
    return vbucket_for_key(key, VBUCKETS)
