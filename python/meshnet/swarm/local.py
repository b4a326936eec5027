"""Starts a real tracker and real nodes as child processes on loopback.

Used by the newcomer's swarm command (run.py), integration tests and benchmarks. Every
process is a real `python -m meshnet.<role>.main` with its own gRPC server; nothing is faked.
Invariant: `LocalSwarm.stop()` (or the context manager) ends every child it started.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from meshnet.recipe.certify import certify


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def _wait_for_port(proc: subprocess.Popen, port_file: Path, log: Path, timeout: float, what: str) -> int:
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log.exists() else ""
            raise RuntimeError(f"{what} did not come up (exit {proc.poll()}):\n{tail}")
        time.sleep(0.05)
    return int(port_file.read_text())


class TrackerProcess:
    def __init__(self, workdir: Path, models: list[dict], secret: str, *, lease_seconds: float = 10.0,
                 ban_seconds: float = 30.0, db: Optional[Path] = None, tls: Optional[tuple[Path, Path]] = None,
                 host: str = "127.0.0.1") -> None:
        self.workdir, self.secret, self.host = workdir, secret, host
        self.db = db or workdir / "tracker.db"
        self.models_file = workdir / "models.json"
        self.models_file.write_text(json.dumps(models))
        self.secret_file = workdir / "secret"
        self.secret_file.write_text(secret)
        self.lease_seconds, self.ban_seconds, self.tls = lease_seconds, ban_seconds, tls
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.log = workdir / "tracker.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "TrackerProcess":
        port_file = self.workdir / "tracker.port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "meshnet.tracker.main", "--listen", f"{self.host}:0", "--db", str(self.db),
               "--models", str(self.models_file), "--secret-file", str(self.secret_file),
               "--lease-seconds", str(self.lease_seconds), "--ban-seconds", str(self.ban_seconds),
               "--port-file", str(port_file)]
        if self.tls:
            cmd += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        self.proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        self.port = _wait_for_port(self.proc, port_file, self.log, 60, "tracker")
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, like a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout=30)
        return self.proc.returncode if self.proc else 0


class NodeProcess:
    def __init__(self, workdir: Path, tracker: TrackerProcess, gguf: Path, model: str, layers: tuple[int, int],
                 node_id: str, *, backend: str = "reference", max_sessions: int = 16, threads: int = 1,
                 worker_binary: Optional[Path] = None, host: str = "127.0.0.1", prefix: Sequence[str] = (),
                 max_kv_tokens: Optional[int] = None) -> None:
        """`prefix` runs the node under another command (e.g. `ip netns exec NS`); `host` is the
        address it listens on and advertises."""
        self.workdir, self.tracker, self.gguf, self.model = workdir, tracker, gguf, model
        self.host, self.prefix, self.max_kv_tokens = host, list(prefix), max_kv_tokens
        self.worker_binary = worker_binary
        self.layers, self.node_id, self.backend = layers, node_id, backend
        self.max_sessions, self.threads = max_sessions, threads
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.log = workdir / f"{node_id}.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def launch(self) -> "NodeProcess":
        port_file = self.workdir / f"{self.node_id}.port"
        port_file.unlink(missing_ok=True)
        self._port_file = port_file
        cmd = [*self.prefix, sys.executable, "-m", "meshnet.node.main", "--tracker", self.tracker.address,
               "--listen", f"{self.host}:0", "--secret-file",
               str(self.tracker.secret_file), "--gguf", str(self.gguf), "--model", self.model, "--layers",
               f"{self.layers[0]}:{self.layers[1]}", "--backend", self.backend, "--node-id", self.node_id,
               "--max-sessions", str(self.max_sessions), "--threads", str(self.threads), "--heartbeat-seconds", "0.5",
               "--drain-seconds", "5", "--port-file", str(port_file)]
        if self.worker_binary is not None:
            cmd += ["--worker-binary", str(self.worker_binary)]
        if self.max_kv_tokens is not None:
            cmd += ["--max-kv-tokens", str(self.max_kv_tokens)]
        self.proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        return self

    def wait_ready(self, timeout: float = 300) -> "NodeProcess":
        self.port = _wait_for_port(self.proc, self._port_file, self.log, timeout, f"node {self.node_id}")
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> Optional[int]:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode if self.proc else None


class LocalSwarm:
    """A tracker plus one node per range in `cuts`, all on loopback."""

    def __init__(self, workdir: Path, gguf: Path, cuts: Sequence[tuple[int, int]], *, model: str = "smollm2",
                 backend: str = "reference", lease_seconds: float = 3.0, max_sessions: int = 16,
                 threads: int = 1, worker_binary: Optional[Path] = None, host: str = "127.0.0.1",
                 node_hosts: Sequence[str] = (), node_prefixes: Sequence[Sequence[str]] = (),
                 max_kv_tokens: Optional[int] = None) -> None:
        """`node_hosts`/`node_prefixes` (one per cut) place nodes elsewhere, e.g. in network
        namespaces; by default every process is on loopback."""
        workdir.mkdir(parents=True, exist_ok=True)
        if backend == "gguf" and worker_binary is None:
            raise ValueError("a gguf swarm needs the worker binary (cpp/worker)")
        self.worker_binary = worker_binary
        self.workdir, self.gguf, self.model, self.backend = workdir, gguf, model, backend
        self.tracker = TrackerProcess(workdir, [certify(gguf, model, backend)], secrets.token_hex(16),
                                      lease_seconds=lease_seconds, host=host)
        self.cuts, self.max_sessions, self.threads = list(cuts), max_sessions, threads
        self.node_hosts, self.node_prefixes, self.max_kv_tokens = list(node_hosts), list(node_prefixes), max_kv_tokens
        self.nodes: dict[str, NodeProcess] = {}

    def start(self) -> "LocalSwarm":
        self.tracker.start()
        for i, cut in enumerate(self.cuts):
            self.add_node(f"node-{i}", cut, wait=False, host=self.node_hosts[i] if self.node_hosts else "127.0.0.1",
                          prefix=self.node_prefixes[i] if self.node_prefixes else ())
        for node in self.nodes.values():
            node.wait_ready()
        return self

    def add_node(self, node_id: str, layers: tuple[int, int], wait: bool = True, host: str = "127.0.0.1",
                 prefix: Sequence[str] = ()) -> NodeProcess:
        node = NodeProcess(self.workdir, self.tracker, self.gguf, self.model, layers, node_id, backend=self.backend,
                           max_sessions=self.max_sessions, threads=self.threads, worker_binary=self.worker_binary,
                           host=host, prefix=prefix, max_kv_tokens=self.max_kv_tokens).launch()
        self.nodes[node_id] = node
        return node.wait_ready() if wait else node

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self.tracker.stop()

    def __enter__(self) -> "LocalSwarm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
