"""Spark jobs on the change stream: the mirror, incremental views, incremental backup and restore.

Theory of operation
-------------------
Each job reads the ``dcpkv`` Spark source (``spark``) and writes versioned tables (``vtable``):
``mirror`` keeps a bucket's documents, ``views`` (a package: definition, job, query, reduce,
the mirror follower) keeps map/reduce emissions, ``backup``/``backup_layout`` keep runs of
changes and restore them. ``sample_data`` and ``loader`` make and write the demo's data set,
``report`` draws the metrics, ``spark_session`` starts a local session. The applications that
put them together (the demo, the node runner) live in :mod:`dcpkv.app`.
"""
