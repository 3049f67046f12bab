"""The official Couchbase SDK (PyPI ``couchbase``) against a real server subprocess.

The SDK is in the ``dev`` extras, so this runs everywhere the tests do. PLAIN only for now:
the SDK's SCRAM client-first nonce contains spaces, which ``scramp`` rejects (issue 4's note).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster
from couchbase.exceptions import DocumentNotFoundException
from couchbase.options import ClusterOptions, ClusterTimeoutOptions
from serverproc import ServerProcess


def test_sdk_upsert_get_remove(server: ServerProcess) -> None:
    auth = PasswordAuthenticator("Administrator", "password", allowed_sasl_mechanisms=["PLAIN"])
    timeouts = ClusterTimeoutOptions(
        kv_timeout=timedelta(seconds=10), connect_timeout=timedelta(seconds=20)
    )
    cluster = Cluster(
        f"couchbase://127.0.0.1:{server.port}", ClusterOptions(auth, timeout_options=timeouts)
    )
    try:
        coll = cluster.bucket("default").default_collection()
        result = coll.upsert("doc1", {"a": 1})
        token = result.mutation_token()
        assert token is not None and token.sequence_number == 1
        assert coll.get("doc1").content_as[dict] == {"a": 1}
        coll.remove("doc1")
        with pytest.raises(DocumentNotFoundException):
            coll.get("doc1")
    finally:
        cluster.close()
