"""The two implementations of the hop contract as real processes, and a ticketed route driver.

Used by the hop conformance suite (tests/hop/hop_conformance_test.py). `HopProcess` starts either
the native worker (cpp/worker) or the reference shard (python -m meshnet.reference.main) with a
node identity, the test tracker's ticket key and a pinned TLS certificate, and reads the port
from their common first stdout line. `Chain` is two hops of one model plus the test tracker's
ticket key; `Stream` is one raw Seam stream; `HonestSession` is a well-behaved client session
(prefill, then decode steps, tokens from Results) run against the chain.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import grpc

from meshnet.identity import certificates, tickets, tls
from meshnet.identity.keys import Identity
from meshnet.process import listening_port
from meshnet.protocol import seam
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.wire import seam as t

V = seam.PROTOCOL_VERSION
_CLOSE = object()


def proc_status(pid: int, field: str) -> int:
    """A number from /proc/<pid>/status ("Threads", or "VmRSS"/"VmHWM" in bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            value = int(line.split()[1])
            return value * 1024 if field.startswith("Vm") else value
    raise KeyError(field)


class HopProcess:
    """One shard service process serving layers [start, end) as node `identity.node_id`."""

    def __init__(self, backend: str, gguf: Path, layers: tuple[int, int], tracker_key: bytes, workdir: Path,
                 *, worker_binary: Optional[Path] = None, max_sessions: int = 4) -> None:
        self.backend, self.layers = backend, layers
        self.identity = Identity.generate()
        self.node_id = self.identity.node_id
        cert, key = certificates.node_certificate()
        self.cert = cert
        name = f"{backend}-{layers[0]}-{layers[1]}"
        cert_path = tls.write_private(workdir / f"{name}.crt", cert)
        key_path = tls.write_private(workdir / f"{name}.key", key)
        if backend == "gguf":
            cmd = [str(worker_binary), f"--model={gguf}", f"--layers={layers[0]}:{layers[1]}",
                   "--listen=127.0.0.1:0", f"--node_id={self.node_id}", f"--tracker_key={tracker_key.hex()}",
                   f"--tls_cert={cert_path}", f"--tls_key={key_path}", "--threads=1",
                   f"--max_sessions={max_sessions}", f"--n_ctx={max_sessions * 512}"]
        else:
            cmd = [sys.executable, "-m", "meshnet.reference.main", "--gguf", str(gguf), "--layers",
                   f"{layers[0]}:{layers[1]}", "--node-id", self.node_id, "--tracker-key", tracker_key.hex(),
                   "--tls-cert", str(cert_path), "--tls-key", str(key_path), "--max-sessions", str(max_sessions)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.log = workdir / f"{name}.log"
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(self.log, "ab"), text=True, env=env)
        port = listening_port(self.proc, timeout=180)
        if port is None:
            self.stop()
            raise RuntimeError(f"{self.backend} hop did not start: {self.log.read_text()[-3000:]}")
        self.port = port
        self.address = f"127.0.0.1:{self.port}"
        self.channel = tls.pinned_channel(self.address, cert)

    def health(self) -> shard_pb2.HealthReply:
        return shard_pb2_grpc.ShardStub(self.channel).Health(shard_pb2.HealthRequest(), timeout=10)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def threads(self) -> int:
        return proc_status(self.proc.pid, "Threads")

    def rss(self) -> int:
        return proc_status(self.proc.pid, "VmRSS")

    def peak_rss(self) -> int:
        return proc_status(self.proc.pid, "VmHWM")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Chain:
    """Hops A = [0, cut) and B = [cut, n_layer) of one model, and the tracker key that tickets them."""

    def __init__(self, backend: str, gguf: Path, cut: int, n_layer: int, workdir: Path,
                 worker_binary: Optional[Path] = None) -> None:
        self.tracker = Identity.generate()
        self.client = Identity.generate()
        self.a = HopProcess(backend, gguf, (0, cut), self.tracker.public_key, workdir, worker_binary=worker_binary)
        try:
            self.b = HopProcess(backend, gguf, (cut, n_layer), self.tracker.public_key, workdir,
                                worker_binary=worker_binary)
        except BaseException:
            self.a.stop()
            raise
        self.hops = (self.a, self.b)

    def body(self, hop: HopProcess, session: t.RouteSession, **changes) -> t.TicketBody:
        """The ticket body the tracker would sign for `hop` in `session` (fields overridable)."""
        nxt = self.b if hop is self.a else None
        fields = dict(session_id=session.session_id, epoch=session.epoch, node_id=hop.node_id,
                      range=t.ShardRange(hop.layers[0], hop.layers[1], hop.layers[0]),
                      downstream_node_id=nxt.node_id if nxt else "", downstream_address=nxt.address if nxt else "",
                      downstream_public_key=nxt.identity.public_key if nxt else b"",
                      downstream_tls_certificate=nxt.cert.decode() if nxt else "",
                      client_public_key=self.client.public_key, client_principal=self.client.principal,
                      expires_unix_ms=tickets.now_ms() + 600_000)
        fields.update(changes)
        return t.TicketBody(**fields)

    def ticket(self, hop: HopProcess, session: t.RouteSession, signer: Optional[Identity] = None,
               **changes) -> t.RouteTicket:
        return tickets.issue(signer or self.tracker, self.body(hop, session, **changes))

    def downstream(self, session: t.RouteSession, address: Optional[str] = None) -> tuple[t.DownstreamHop, ...]:
        """B's ticket, as a seam minor 1 sender writes it; with `address`, the entry a 1.0 sender
        wrote (node id, address, range), naming that address instead of B's."""
        b = self.b
        if address is None:
            return (t.DownstreamHop("", "", None, self.ticket(b, session)),)
        return (t.DownstreamHop(b.node_id, address, t.ShardRange(*b.layers, b.layers[0]), self.ticket(b, session)),)

    def stop(self) -> None:
        for hop in self.hops:
            hop.stop()


class Stream:
    """One raw Seam stream: frames in, replies out (a reader thread fills `replies`)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._frames: queue.Queue = queue.Queue()
        self.replies: queue.Queue = queue.Queue()
        self._call = shard_pb2_grpc.ShardStub(channel).Seam(iter(self._frames.get, _CLOSE))
        self.error: Optional[grpc.RpcError] = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self.replies.put(seam.from_proto(reply))
        except grpc.RpcError as err:
            self.error = err
            self.replies.put(err)

    def send(self, frame: t.SeamFrame) -> None:
        self._frames.put(seam.to_proto(frame))

    def read(self, timeout: float = 30.0) -> t.SeamReply:
        reply = self.replies.get(timeout=timeout)
        if isinstance(reply, grpc.RpcError):
            raise reply
        return reply

    def ask(self, frame: t.SeamFrame, timeout: float = 30.0) -> t.SeamReply:
        self.send(frame)
        return self.read(timeout)

    def close(self) -> None:
        self._frames.put(_CLOSE)


def prefill(chain: Chain, session: t.RouteSession, prompt: Sequence[int], **overrides) -> t.SeamFrame:
    """The first frame of a ticketed session on hop A (overridable, for attacks)."""
    a = chain.a
    fields = dict(version=V, session=session, phase=t.Phase.PREFILL, step=1,
                  range=t.ShardRange(a.layers[0], a.layers[1], a.layers[0]), span=t.TokenSpan(0, len(prompt)),
                  token_ids=tuple(prompt), sampling=t.SamplingParams(),
                  downstream=chain.downstream(session), ticket=chain.ticket(a, session))
    fields.update(overrides)
    return t.SeamFrame(**fields)


def control(session: t.RouteSession, phase: t.Phase, ticket: Optional[t.RouteTicket] = None) -> t.SeamFrame:
    return t.SeamFrame(V, session, phase, 1 << 62, ticket=ticket)


class HonestSession:
    """A well-behaved client session through the chain: prefill now, decode in `finish`."""

    def __init__(self, chain: Chain, session_id: str, prompt: Sequence[int], tokens: int) -> None:
        self.chain, self.prompt, self.tokens = chain, list(prompt), tokens
        self.session = t.RouteSession(session_id, 1)
        self._channel_a = tls.pinned_channel(chain.a.address, chain.a.cert)
        self._channel_b = tls.pinned_channel(chain.b.address, chain.b.cert)
        ticket_b = chain.ticket(chain.b, self.session)
        request = t.ResultsRequest(V, self.session, ticket_b, tickets.results_signature(chain.client, ticket_b))
        self._results = shard_pb2_grpc.ShardStub(self._channel_b).Results(seam.to_proto(request), timeout=120)
        self._tokens: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_results, daemon=True).start()
        self.stream = Stream(self._channel_a)
        # Wait until both hops hold the session (hop A acknowledged the prefill, hop B emitted the
        # first token), so an attack that follows always meets a session bound to its stream.
        ack = self.stream.ask(prefill(chain, self.session, self.prompt), timeout=60)
        if not ack.status.ok:
            raise AssertionError(f"honest session {session_id} refused at prefill: {ack.status}")
        self._first = self._next()

    def _read_results(self) -> None:
        try:
            for frame in self._results:
                native = seam.from_proto(frame)
                if native.tokens:
                    self._tokens.put(native.tokens[0].token_id)
                elif native.status is not None and not native.status.ok:
                    self._tokens.put(native.status)
        except grpc.RpcError as err:
            self._tokens.put(err)

    def _next(self) -> int:
        item = self._tokens.get(timeout=60)
        if not isinstance(item, int):
            raise AssertionError(f"honest session {self.session.session_id} failed: {item}")
        return item

    def finish(self) -> list[int]:
        """Decodes to `tokens` tokens, releases, and returns them."""
        out, position = [self._first], len(self.prompt)
        for step in range(2, self.tokens + 1):
            self.stream.send(t.SeamFrame(V, self.session, t.Phase.DECODE, step, span=t.TokenSpan(position, 1),
                                         token_ids=(out[-1],)))
            position += 1
            out.append(self._next())
        self.stream.send(control(self.session, t.Phase.RELEASE))
        self.close()
        return out

    def close(self) -> None:
        """Ends the session's streams (a hop frees a session whose stream is gone)."""
        self.stream.close()
        self._results.cancel()
        self._channel_a.close()
        self._channel_b.close()


def wait_idle(chain: Chain, timeout: float = 10.0) -> list[tuple[int, int]]:
    """(sessions, KV cells) per hop once both are 0, or as they are at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        state = [(h.active_sessions, h.kv_cells_used) for h in (hop.health() for hop in chain.hops)]
        if all(s == (0, 0) for s in state) or time.monotonic() > deadline:
            return state
        time.sleep(0.05)
