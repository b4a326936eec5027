"""Starts the real tracker (python -m meshnet.tracker.main) as a child process for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

SECRET = "test-swarm-secret"


class TrackerProcess:
    def __init__(self, workdir: Path, models: list[dict], lease_seconds: float = 10.0,
                 db: Optional[Path] = None) -> None:
        self.workdir = workdir
        self.db = db or workdir / "tracker.db"
        self.models_file = workdir / "models.json"
        self.models_file.write_text(json.dumps(models))
        (workdir / "secret").write_text(SECRET)
        self.lease_seconds = lease_seconds
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.log = workdir / "tracker.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "TrackerProcess":
        port_file = self.workdir / "port"
        port_file.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        cmd = [sys.executable, "-m", "meshnet.tracker.main", "--listen", "127.0.0.1:0", "--db", str(self.db),
               "--models", str(self.models_file), "--secret-file", str(self.workdir / "secret"),
               "--lease-seconds", str(self.lease_seconds), "--ban-seconds", "30", "--port-file", str(port_file)]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tracker did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, like a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout=30)
        return self.proc.returncode if self.proc else 0
