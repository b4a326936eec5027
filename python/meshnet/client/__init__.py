"""The Meshnet client: route sessions that stream generated tokens from a chain of shards."""
