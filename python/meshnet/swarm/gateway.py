"""Starts the OpenAI-compatible gateway as a child process in front of a LocalSwarm.

Used by `swarm --serve` (run.py), the gateway's integration tests and the gateway bench lane.
The gateway is a real `python -m meshnet.gateway.main` on its own port, with the swarm's
gateway role token, the tracker's CA and an API keys file written here (0600).
Invariant: `stop()` (or the context manager) ends the process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from meshnet.gateway.keys import new_key
from meshnet.identity import tls
from meshnet.process import child_env
from meshnet.swarm.local import LocalSwarm, wait_for_port


class GatewayProcess:
    def __init__(self, swarm: LocalSwarm, *, keys: Optional[Sequence[dict]] = None, host: str = "127.0.0.1",
                 port: int = 0, extra_args: Sequence[str] = (), gguf: Optional[Path] = None,
                 name: str = "gateway") -> None:
        """`keys`: entries as in meshnet/gateway/keys.py; by default one key, "local", allowed
        64 concurrent generations (`self.key`). `gguf`: the file it serves the model from (default
        the swarm's, the certified one); `name`: its folder under the swarm's."""
        self.swarm, self.host, self.port = swarm, host, port
        self.gguf = gguf or swarm.gguf
        self.workdir = swarm.workdir / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.key = new_key()
        entries = list(keys) if keys is not None else [{"name": "local", "key": self.key, "max_concurrent": 64}]
        self.keys_file = tls.write_private(self.workdir / "keys.json", json.dumps(entries).encode())
        self.extra_args = list(extra_args)
        self.proc: Optional[subprocess.Popen] = None
        self.log = self.workdir / "gateway.log"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 120.0) -> "GatewayProcess":
        port_file = self.workdir / "gateway.port"
        port_file.unlink(missing_ok=True)
        tracker = self.swarm.tracker
        cmd = [sys.executable, "-m", "meshnet.gateway.main", "--tracker", tracker.address,
               "--token-file", str(tracker.token_files["gateway"]),
               "--model", f"{self.swarm.model}={self.gguf}", "--keys-file", str(self.keys_file),
               "--listen", f"{self.host}:{self.port}", "--port-file", str(port_file), *self.extra_args]
        if tracker.ca is None:
            cmd.append("--insecure")
        else:
            ca = tls.write_private(self.workdir / "tracker-ca.pem", tracker.ca)
            cmd += ["--tracker-ca", str(ca)]
        self.proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        self.port = wait_for_port(self.proc, port_file, self.log, timeout, "gateway")
        return self

    def stop(self) -> Optional[int]:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode if self.proc else None

    def __enter__(self) -> "GatewayProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
