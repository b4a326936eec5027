"""Local swarms: a tracker and nodes as child processes on loopback (newcomers, tests, benches)."""
