"""The node: serves one layer range, registers it with the tracker, keeps its lease."""
