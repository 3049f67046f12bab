"""The data engine: vbuckets, checkpoints (the write queue), the flusher, storage, warm-up."""
