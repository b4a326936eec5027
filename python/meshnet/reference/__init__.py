"""The Transformers reference shard: the correctness and performance baseline backend."""
