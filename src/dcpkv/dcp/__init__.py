"""The DCP producer: connections and per-vbucket stream state machines."""
