"""The two shard backends a node can run, behind one small interface.

`ReferenceBackend` serves HF Transformers layers in this process; `GgufBackend` supervises the
native worker (cpp/worker) as a child process and restarts it if it dies. Both expose the
shard's address, its live-session count, heartbeat telemetry and the longest session it can hold
(registered as Capacity.max_session_tokens, so the tracker refuses longer sessions up front).
Main thread only.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Optional, Protocol

from meshnet.node.telemetry import RateMeter
from meshnet.node.worker import WorkerProcess, take_work
from meshnet.protocol.shard_client import ShardClient
from meshnet.wire import tracker as tt


class Backend(Protocol):
    kind: tt.BackendKind

    @property
    def address(self) -> str: ...

    @property
    def max_session_tokens(self) -> int: ...

    def load(self) -> tt.Load: ...

    def take_work(self) -> tuple[tt.WorkEntry, ...]: ...

    def alive(self) -> bool: ...

    def restart(self) -> None: ...

    def kill(self) -> None: ...

    def stop(self) -> None: ...


class ReferenceBackend:
    kind = tt.BackendKind.REFERENCE

    def __init__(self, gguf: Path, layers: tuple[int, int], listen: str, node_id: str, *, max_sessions: int, max_kv_tokens: int, idle_seconds: float,
                 tracker_key: bytes, tls: Optional[tuple[bytes, bytes]]) -> None:
        """`tls`: (certificate PEM, key PEM) of the shard service, or None for plaintext (--insecure)."""
        # Imported here: torch and transformers cost a GGUF node's control process ~400 MiB.
        from meshnet.reference.model import ReferenceEngine, ShardModel, load_model
        from meshnet.reference.server import serve_shard

        self.engine = ReferenceEngine(ShardModel(load_model(gguf), *layers), max_sessions, max_kv_tokens)
        self.node_id = node_id
        self._supervisor_token = secrets.token_hex(16)  # TakeWork answers only this node
        self._server, port = serve_shard(self.engine, node_id, tracker_key, listen, tls,
                                         idle_seconds=idle_seconds, supervisor_token=self._supervisor_token)
        self._address = f"{listen.rsplit(':', 1)[0]}:{port}"
        self._shard = ShardClient.dial(self._address, tls[0] if tls else None)
        self._meter = RateMeter()

    def take_work(self) -> tuple[tt.WorkEntry, ...]:
        return take_work(self._shard, self._supervisor_token)

    @property
    def address(self) -> str:
        return self._address

    @property
    def max_session_tokens(self) -> int:
        """One session may fill the whole KV budget (the engine shares it among sessions)."""
        return self.engine.max_kv_tokens

    def load(self) -> tt.Load:
        sessions, tokens = self.engine.stats()
        rate = self._meter.update(self.engine.rows, self.engine.compute_seconds)
        return tt.Load(active_sessions=sessions, kv_cells_used=tokens, kv_cells_total=self.engine.max_kv_tokens,
                       decode_tokens_per_second=rate)

    def alive(self) -> bool:
        return True

    def restart(self) -> None:
        raise RuntimeError("the reference backend runs in the node process; it cannot restart alone")

    def kill(self) -> None:
        raise RuntimeError("the reference backend runs in the node process; it cannot be killed alone")

    def stop(self) -> None:
        self._shard.close()
        self._server.stop(grace=2).wait()


class GgufBackend:
    kind = tt.BackendKind.GGUF

    def __init__(self, worker_binary: Path, gguf: Path, layers: tuple[int, int], listen: str, node_id: str, *,
                 threads: int, max_sessions: int, max_kv_tokens: int, idle_seconds: float, log: Optional[Path],
                 tracker_key: bytes, tls: Optional[tuple[Path, Path]], node_key: bytes = b"", cheat: str = "",
                 commitments: bool = True, reference_kernels: bool = True,
                 f32_matmul_activations: bool = False, device: str = "cpu") -> None:
        """`tls`: paths of the shard service's certificate and key PEM, or None (--insecure).
        `node_key`: the identity seed the worker signs commitments with; `cheat`: tests only.
        `device`: the worker's --device (ADR 0014)."""
        self.node_id = node_id
        self._worker = WorkerProcess(worker_binary, gguf, layers, listen.rsplit(":", 1)[0], node_id, threads=threads,
                                     max_sessions=max_sessions, n_ctx=max_kv_tokens, idle_seconds=idle_seconds,
                                     tracker_key=tracker_key,
                                     tls=tls, log=log, node_key=node_key, cheat=cheat, commitments=commitments,
                                     reference_kernels=reference_kernels,
                                     f32_matmul_activations=f32_matmul_activations, device=device)
        self._worker.start()

    @property
    def address(self) -> str:
        return self._worker.address

    @property
    def max_session_tokens(self) -> int:
        """The worker gives each session its own n_ctx / n_seq KV cells (--unified_kv=0)."""
        return self._worker.n_ctx // self._worker.max_sessions

    def load(self) -> tt.Load:
        return self._worker.load()

    def take_work(self) -> tuple[tt.WorkEntry, ...]:
        return self._worker.take_work()

    def alive(self) -> bool:
        return self._worker.alive()

    def restart(self) -> None:
        self._worker.stop()
        self._worker.start()

    def kill(self) -> None:
        self._worker.kill()

    def stop(self) -> None:
        self._worker.stop()
