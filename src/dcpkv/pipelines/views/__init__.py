"""Incremental map/reduce views over a bucket's JSON documents (CouchDB/Couchbase style).

Theory of operation
-------------------
A view ``NAME`` lives in ``views_dir/NAME/``: ``view.json`` (the map function, the reduce, and
the source of the last run) and a versioned change table (``vtable.py``) whose rows are the
*emissions of one version of one document*: ``(vbucket, key, seqno, op, emits)`` where
``emits`` is the list of ``(emit key, emit value)`` the map function returned for that
version, both as JSON text. So the view is a mirror whose payload is the map's output:

* an update is a new version: the document's current version is its live row with the
  highest seqno, so its old emissions are retracted by being superseded;
* a deletion/expiration is a version with no emissions;
* rollback rows become the same manifest entries as in the mirror (with the same resync
  fallback), so the view falls back exactly to the emissions of the surviving versions.

The map runs once per change, in the Spark tasks (a Python UDF); reduce runs at query time
over the current emissions (count, sum, stats built in, or a custom ``module:function`` that
gets the list of values), grouped by emit key with ``group``.

Two sources. A :class:`~dcpkv.pipelines.source_node.SourceSettings` streams from the server (the
same ``TableJob`` as the mirror). A mirror path follows the mirror's batches instead: a tiny
streaming source (``dcpkvmirrorticks``) offers the mirror's batch ordinal as its offset, and
each batch copies the mirror's rows with ``ord`` in (done, M] through the map, keeping their
``ord``/``pos``, and the mirror's entries, floors and applied offsets: the view's liveness
rules then give exactly the map of the mirror's documents. A mirror compaction drops old
deletions only once they are older than its previous compaction; a view further behind than
that rebuilds from the mirror.

``query_view`` reads the view's Parquet files through its manifest with pyarrow on the driver
(no Spark job: a query is small next to starting one). ``stale="false"`` first reads the
server's vbucket uuids and high seqnos, then waits (bounded by ``timeout``) until the view's
applied offsets reach them on the same branch: the barrier of spec 002. Emit keys sort in
CouchDB collation (null, false, true, numbers, strings, arrays, objects).
"""

from dcpkv.pipelines.views.definition import ViewError, create_view, view_definition
from dcpkv.pipelines.views.job import start_view
from dcpkv.pipelines.views.query import query_view
from dcpkv.pipelines.views.reduce import stats

__all__ = ["ViewError", "create_view", "query_view", "start_view", "stats", "view_definition"]
