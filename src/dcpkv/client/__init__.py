"""The client library: KV and DCP clients, offsets, the consumer's rollback point."""
