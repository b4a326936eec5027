"""The worker is started with the node's settings (issue 55: `--session-idle-seconds` never reached
a GGUF worker, which freed idle sessions after its own 300 s)."""

from pathlib import Path

import pytest

from meshnet.node.worker import WorkerProcess


@pytest.mark.parametrize("idle,flag", [(42.0, "--idle_seconds=42"), (0.2, "--idle_seconds=1"), (2.5, "--idle_seconds=3")])
def test_the_session_idle_timeout_reaches_the_worker(tmp_path: Path, idle: float, flag: str):
    binary = tmp_path / "worker"
    binary.write_text("")  # never started: only its command line is read
    worker = WorkerProcess(binary, tmp_path / "m.gguf", (0, 30), "127.0.0.1", "node", threads=1, max_sessions=4,
                           n_ctx=1024, tracker_key=b"\0" * 32, idle_seconds=idle, tls=None)
    assert [arg for arg in worker._cmd if arg.startswith("--idle_seconds=")] == [flag]
