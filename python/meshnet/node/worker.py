"""Supervision of the native shard worker (cpp/worker) as a child process of the node.

The node starts `worker --model ... --layers A:B --listen HOST:0 --node_id ID --tracker_key HEX
(--tls_cert C --tls_key K | --insecure=1)`, reads the bound port from the worker's first stdout
line ({"event": "listening", "port": N}), waits until Health answers (over the same pinned TLS
a peer uses), and polls Health for heartbeat telemetry. Called from the node's main thread only.
Invariant: stop() leaves no worker process behind (SIGTERM, then SIGKILL after a grace), and a
node that dies without stop() takes its worker with it: the worker gets `--parent_pid` and
sets PR_SET_PDEATHSIG = SIGKILL itself (no preexec_fn: forking a process that runs gRPC aborts
the child). It is started from the node's main thread, as the signal follows the thread that
spawned it.
"""

from __future__ import annotations

import math
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Optional

import grpc

from meshnet.identity.requests import SUPERVISOR_ENV
from meshnet.node.telemetry import RateMeter
from meshnet.process import listening_port
from meshnet.protocol.shard_client import ShardClient
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Health


class WorkerError(RuntimeError):
    pass


MAX_BATCH_TOKENS = 256  # the worker's --max_batch_tokens (rows per engine decode)
# The worker's --batch_window_us: how long its engine may wait for a session that decoded in
# the last few batches before it decodes without it (cpp/worker/scheduler/scheduler.h; a lone session
# never waits). The bench's c=8 cells report what it costs and gains.
BATCH_WINDOW_US = 2000
NODE_KEY_ENV = "MESHNET_NODE_KEY"  # the worker signs commitments with it (cpp/worker/main.cc)


def take_work(shard: ShardClient, supervisor_token: str) -> tuple[tt.WorkEntry, ...]:
    """Tokens processed per session since the last call, taken from this node's shard service."""
    return shard.take_work(supervisor_token, timeout=5)


def server_threads(max_sessions: int) -> int:
    """gRPC threads (and streams per connection) the worker needs so that Health, Hello and new
    sessions are still answered with every session live: each session holds a Seam stream, and
    on the last hop a Results stream as well, each on a thread of its own. Fewer, and a busy hop
    stops answering the Health probe that clients use to tell a slow hop from a dead one."""
    return 2 * max_sessions + 16


class WorkerProcess:
    def __init__(self, binary: Path, gguf: Path, layers: tuple[int, int], host: str, node_id: str, *,
                 threads: int, max_sessions: int, n_ctx: int, tracker_key: bytes, idle_seconds: float = 300.0,
                 tls: Optional[tuple[Path, Path]], log: Optional[Path] = None, node_key: bytes = b"",
                 cheat: str = "", commitments: bool = True, reference_kernels: bool = True,
                 f32_matmul_activations: bool = False, device: str = "cpu") -> None:
        """`tls`: (certificate PEM path, key PEM path), or None to serve plaintext (--insecure).
        `node_key`: the node's identity seed, with which the worker signs its commitments (ADR
        0008; through the environment, never argv). `cheat`: tests only (the worker's --cheat).
        `commitments` False: the worker keeps none (benchmarks of their cost only).
        `reference_kernels` False: upstream's CPU defaults, ggml's optimized kernels and flash
        attention over an F16 KV cache, under which sessions batched together may differ from
        solo and agreement with fp32 math drops (ADR 0009, 0010; benchmarks of that cost only).
        `f32_matmul_activations`: quantized weights dequantized and dotted with F32 activations,
        for a model certified with that recipe (ADR 0012). `device`: where the range computes
        ("cpu", "vulkan0", ...; the binary must link that backend, ADR 0014). `idle_seconds`: a
        session with no frame for this long is freed (the worker's --idle_seconds, whole seconds,
        at least 1)."""
        if not binary.is_file():
            raise WorkerError(f"no worker binary at {binary}")
        self._cmd = [str(binary), f"--model={gguf}", f"--layers={layers[0]}:{layers[1]}", f"--listen={host}:0",
                     f"--threads={threads}", f"--max_sessions={max_sessions}", f"--n_ctx={n_ctx}",
                     f"--idle_seconds={max(1, math.ceil(idle_seconds))}",
                     f"--max_batch_tokens={MAX_BATCH_TOKENS}", f"--batch_window_us={BATCH_WINDOW_US}",
                     f"--max_threads={server_threads(max_sessions)}",
                     f"--max_concurrent_streams={server_threads(max_sessions)}",
                     f"--node_id={node_id}", f"--tracker_key={tracker_key.hex()}"]
        self._cmd += [f"--tls_cert={tls[0]}", f"--tls_key={tls[1]}"] if tls else ["--insecure=1"]
        self._cmd += [f"--cheat={cheat}"] if cheat else []
        self._cmd += [] if commitments else ["--commitments=0"]
        self._cmd += [] if reference_kernels else ["--reference_kernels=0", "--f32_attention=0"]
        self._cmd += ["--f32_matmul_activations=1"] if f32_matmul_activations else []
        self._cmd += [f"--device={device}"] if device != "cpu" else []
        self._node_key = node_key
        self._cert = tls[0].read_bytes() if tls else None
        self._supervisor_token = secrets.token_hex(16)  # TakeWork answers only this process
        self._host = host
        self._log = log
        self.n_ctx, self.max_sessions = n_ctx, max_sessions
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self._meter = RateMeter()
        self._shard: Optional[ShardClient] = None

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    def start(self, timeout: float = 120.0) -> "WorkerProcess":
        stderr = open(self._log, "ab") if self._log else subprocess.DEVNULL
        env = dict(os.environ, **{SUPERVISOR_ENV: self._supervisor_token})
        if self._node_key:
            env[NODE_KEY_ENV] = self._node_key.hex()
        self.proc = subprocess.Popen(self._cmd + [f"--parent_pid={os.getpid()}"], stdout=subprocess.PIPE,
                                     stderr=stderr, text=True, env=env)
        port = listening_port(self.proc, timeout)
        if port is None:
            code = self.proc.poll()
            self.stop()
            raise WorkerError(f"worker did not start listening within {timeout:.0f}s (exit {code}); see {self._log}")
        self.port = port
        self._shard = ShardClient.dial(self.address, self._cert)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.health()
                return self
            except grpc.RpcError:
                if time.monotonic() > deadline or not self.alive():
                    self.stop()
                    raise WorkerError(f"worker at {self.address} never answered Health") from None
                time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def health(self) -> Health:
        return self._shard.health(timeout=5)

    def load(self) -> tt.Load:
        """Heartbeat telemetry from the worker's Health: sessions, queue, KV, batch occupancy and
        the measured compute rate (rows per second of engine time since the previous call,
        smoothed; a throttled or slow worker reports less, and the tracker routes around it)."""
        h = self.health()
        rows, compute_s = h.batches * h.mean_batch_rows, h.compute_us / 1e6
        rate = self._meter.update(rows, compute_s)
        return tt.Load(active_sessions=h.active_sessions, queue_depth=h.queue_depth, kv_cells_used=h.kv_cells_used,
                       kv_cells_total=h.kv_cells_total, batch_occupancy=h.mean_batch_rows / MAX_BATCH_TOKENS,
                       decode_tokens_per_second=rate)

    def take_work(self) -> tuple[tt.WorkEntry, ...]:
        return take_work(self._shard, self._supervisor_token)

    def kill(self) -> None:
        """SIGKILL (a hung worker ignores SIGTERM); stop() then finds nothing to wait for."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, grace: float = 10.0) -> None:
        if self._shard is not None:
            self._shard.close()
            self._shard = None
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
