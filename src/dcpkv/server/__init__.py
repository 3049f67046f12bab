"""The asyncio data server: a thin shell around the protocol codec and the engine."""
