"""Spark jobs on the change stream: mirror, incremental backup and restore, incremental views."""
