"""Benchmarks: they write results (JSON) and never assert timings (see docs/adr and issue notes)."""
