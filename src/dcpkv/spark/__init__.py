"""The change stream as a PySpark data source, the store as a sink, and the pipelines."""
