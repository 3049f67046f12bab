"""JSON documents through the official Couchbase SDK (``pip install couchbase``), on a dcpkv node.

    .venv/bin/python examples/sdk_documents.py

The SDK connects as it does to Couchbase Server (SCRAM-SHA512 login, the cluster map) and
needs nothing else: an upsert and a get, a sub-document update of one field, a replace
guarded by the document's CAS (an optimistic lock), and a remove.

On a cluster with replicas (``dcpkv cluster up --replicas 1``) the SDK's durable writes work
too: ``UpsertOptions(durability=ClientDurability(ReplicateTo.ONE, PersistTo.ONE))`` polls
ObserveSeqno as ``examples/durable_write.py`` does (the SDK counts a replica in
``PersistTo.ONE``, so on a single node it answers DurabilityImpossible).
"""

from __future__ import annotations

from datetime import timedelta

import couchbase.subdocument as SD
from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster
from couchbase.exceptions import CasMismatchException
from couchbase.options import ClusterOptions, ReplaceOptions
from example_options import parser_for


def main() -> None:
    parser = parser_for(__doc__)
    args = parser.parse_args()

    cluster = Cluster(args.connect, ClusterOptions(PasswordAuthenticator(args.user, args.password)))
    cluster.wait_until_ready(timedelta(seconds=10))
    docs = cluster.bucket("default").default_collection()
    try:
        docs.upsert("customer::1", {"name": "Ada", "country": "France", "orders": 0})
        print("get:", docs.get("customer::1").content_as[dict])

        docs.mutate_in("customer::1", [SD.increment("orders", 1)])  # one field, in place
        orders = docs.lookup_in("customer::1", [SD.get("orders")]).content_as[int](0)
        print("orders after mutate_in:", orders)

        stale = docs.get("customer::1").cas
        docs.upsert("customer::1", {"name": "Ada", "country": "Spain", "orders": 1})
        try:  # someone changed it since we read it: the CAS no longer matches
            docs.replace("customer::1", {"name": "Ada"}, ReplaceOptions(cas=stale))
        except CasMismatchException:
            print("replace with a stale CAS: refused")

        docs.remove("customer::1")
        print("customer::1 removed:", not docs.exists("customer::1").exists)
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
