"""A relayed node's side of the relay (ADR 0007): hold an allocation, pipe each connection home.

`RelayAgent` dials the relay, holds `Attach` open and, for each connection a peer makes to the
allocation, opens a `Pipe` and a TCP connection to the node's own shard service (on loopback)
and copies bytes between them, unchanged. It measures the node's round trip to the relay
(`rtt_ms`, the median of a few Pings) each time it attaches. If the relay goes away it attaches
again with backoff (1 s doubling to 30 s; failing the first attach is final) and reports the new allocation through `on_address`,
so the node registers it. It runs its own asyncio loop in a thread.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import Callable, Optional

import grpc

from meshnet.identity.keys import Identity
from meshnet.identity.requests import sign_request
from meshnet.process import log
from meshnet.relay.errors import RelayUnavailable
from meshnet.relay.server import ATTACH, CHUNK_BYTES, CONNECTION_METADATA, KEEPALIVE_MS, PING, PIPE, agent_options
from meshnet.relay.v1 import relay_pb2, relay_pb2_grpc

PINGS = 5


class RelayAgent:
    def __init__(self, relay: str, identity: Identity, token: str, local: Callable[[], str], *,
                 ca: Optional[bytes] = None, on_address: Callable[[str], None] = lambda address: None,
                 max_backoff: float = 30.0, keepalive_ms: int = KEEPALIVE_MS) -> None:
        """`relay`: host:port of the Relay service; `ca`: PEM that verifies its TLS certificate
        (None = plaintext, development only). `local()`: host:port of the shard service that
        connections are piped to (asked per connection: a restarted worker may move)."""
        self._relay, self._identity, self._token, self._local = relay, identity, token, local
        self._ca, self._on_address, self._max_backoff = ca, on_address, max_backoff
        self._options = agent_options(keepalive_ms)
        self.address = ""  # the allocation; "" until attached
        self.attaches = 0  # allocations received so far (more than 1: the agent attached again)
        self.rtt_ms = 0.0
        self.pipes = 0  # connections piped so far
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._task: Optional[asyncio.Task] = None
        self._thread: Optional[threading.Thread] = None
        self._attached = threading.Event()
        self._failure: Optional[str] = None

    def start(self, timeout: float = 30.0) -> str:
        """Attaches (in a background thread) and returns the allocation's address; raises
        RelayUnavailable when the first attach fails or takes longer than `timeout`."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="meshnet-relay-agent",
                                        daemon=True)
        self._thread.start()
        if not self._attached.wait(timeout) or not self.address:
            self.stop()
            raise RelayUnavailable(self._failure or f"no allocation from the relay at {self._relay} within {timeout} s")
        return self.address

    def stop(self) -> None:
        if self._loop is not None and self._task is not None:
            try:
                self._loop.call_soon_threadsafe(self._task.cancel)
            except RuntimeError:  # the loop already ended (a refused first attach ends it)
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _metadata(self, method: str, payload: bytes) -> tuple[tuple[str, str], ...]:
        return sign_request(self._identity, self._token, method, payload)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        backoff = 0.0
        try:
            while True:
                try:
                    await self._attach_once()
                    backoff = 0.0  # it held an allocation: start over
                except grpc.aio.AioRpcError as err:
                    self._failure = f"relay {self._relay}: {err.code().name}: {err.details()}"
                    if not self._attached.is_set():
                        self._attached.set()  # failing to attach at start is final: start() raises it
                        return
                    log("relay_lost", relay=self._relay, error=err.code().name, message=err.details())
                backoff = min(self._max_backoff, max(1.0, backoff * 2))
                await asyncio.sleep(backoff)
        except asyncio.CancelledError:
            pass
        finally:
            self._attached.set()

    def _channel(self) -> grpc.aio.Channel:
        if self._ca is None:
            return grpc.aio.insecure_channel(self._relay, options=self._options)
        return grpc.aio.secure_channel(self._relay, grpc.ssl_channel_credentials(root_certificates=self._ca),
                                       options=self._options)

    async def _attach_once(self) -> None:
        async with self._channel() as channel:
            stub = relay_pb2_grpc.RelayStub(channel)
            request = relay_pb2.AttachRequest(node_id=self._identity.node_id)
            events = stub.Attach(request, metadata=self._metadata(ATTACH, request.SerializeToString()))
            pipes: set[asyncio.Task] = set()
            try:
                async for event in events:
                    if event.HasField("allocation"):
                        self.rtt_ms = await self._measure_rtt(stub)
                        changed = self.address and self.address != event.allocation.address
                        self.address = event.allocation.address
                        self.attaches += 1
                        log("relay_allocation", relay=self._relay, address=self.address, rtt_ms=round(self.rtt_ms, 3))
                        self._attached.set()
                        if changed:
                            self._on_address(self.address)
                    elif event.HasField("incoming"):
                        task = asyncio.ensure_future(self._pipe(stub, event.incoming.connection_id))
                        pipes.add(task)
                        task.add_done_callback(pipes.discard)
            finally:
                for task in list(pipes):
                    task.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)

    async def _measure_rtt(self, stub: relay_pb2_grpc.RelayStub) -> float:
        rtts = []
        for _ in range(PINGS):
            request = relay_pb2.PingRequest(unix_nanos=time.time_ns())
            started = time.perf_counter()
            await stub.Ping(request, metadata=self._metadata(PING, request.SerializeToString()), timeout=10)
            rtts.append((time.perf_counter() - started) * 1000)
        return statistics.median(rtts)

    async def _pipe(self, stub: relay_pb2_grpc.RelayStub, connection_id: int) -> None:
        raw = str(connection_id)
        host, _, port = self._local().rpartition(":")
        try:
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError as err:  # the relay closes the peer's connection when it is not piped
            log("relay_pipe_failed", connection=raw, error=str(err))
            return
        call = stub.Pipe(metadata=self._metadata(PIPE, raw.encode()) + ((CONNECTION_METADATA, raw),))
        self.pipes += 1

        async def up() -> None:  # the shard's bytes, to the peer
            while data := await reader.read(CHUNK_BYTES):
                await call.write(relay_pb2.Chunk(data=data))
            await call.done_writing()

        async def down() -> None:  # the peer's bytes, to the shard
            async for chunk in call:
                writer.write(chunk.data)
                await writer.drain()

        tasks = {asyncio.ensure_future(up()), asyncio.ensure_future(down())}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            call.cancel()
            writer.close()
            await asyncio.gather(*tasks, return_exceptions=True)
