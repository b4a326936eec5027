"""Certification of a model for the swarm: the parity suite a GGUF must pass before a tracker
serves it (//python:certify). `route_parity` (a 3-node route and 8 concurrent sessions against
single-process llama.cpp), `teacher_forced` (top-1 and KL against Transformers fp32 on the same
weights), `shard_memory` (each shard holds what its range owns), `main` (the command, which
writes the tracker's entry only when every check passes)."""
