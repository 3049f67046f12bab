"""Applications assembled from the layers below: the demo (``dcpkv demo``, ``make run``) and
the subprocess node runner it starts a ``dcpkv server`` with.

Theory of operation
-------------------
``node`` runs one data server as a child process (port checks, readiness, clean SIGTERM);
``demo`` starts a node, loads the sample data, runs the mirror and a view on Spark while a
generator writes, and draws the report at the end. They sit above ``pipelines`` and below
``cli`` in the layer contract: the commands are thin shells over them.
"""
