"""Issue 35, finding 1: idle and trickling connections no longer take an HTTP surface from
everyone. A real uvicorn on a loopback socket, bounded by http_bounds, against attackers from
127.0.0.1 while an honest client connects from 127.0.0.2 (both loopback on Linux)."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from meshnet.http_bounds import ConnectionCounts, HttpBounds, uvicorn_config
from meshnet.socket_checks import closed_by_server

BOUNDS = HttpBounds(request_timeout=1.0, max_connections=100, max_per_peer=20, max_in_flight=4)
HONEST = "127.0.0.2"


@pytest.fixture(scope="module", autouse=True)
def enough_file_descriptors():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Server:
    """Test app: /ok answers at once; /hold waits until `release` is set; /body reads the body."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.holding = 0

        async def ok(request: Request) -> PlainTextResponse:
            return PlainTextResponse("ok")

        async def hold(request: Request) -> PlainTextResponse:
            self.holding += 1
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            return PlainTextResponse("held")

        async def body(request: Request) -> PlainTextResponse:
            return PlainTextResponse(f"{len(await request.body())} bytes")

        self.counts = ConnectionCounts()
        config = uvicorn_config(Starlette(routes=[Route("/ok", ok), Route("/hold", hold),
                                                  Route("/body", body, methods=["POST"])]), BOUNDS, self.counts,
                                log_level="warning")
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(2048)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])),
                                       daemon=True)

    def __enter__(self) -> "Server":
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.should_exit = True
        self.thread.join(timeout=10)


def get(port: int, path: str = "/ok", source: str = HONEST, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of one GET from `source`."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@contextlib.contextmanager
def idle_connections(port: int, n: int):
    sockets = []
    try:
        for _ in range(n):
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        yield sockets
    finally:
        for s in sockets:
            s.close()


def test_a_thousand_idle_connections_leave_the_server_to_everyone_else():
    with Server() as server, idle_connections(server.port, 1000) as idle:
        time.sleep(0.2)
        assert get(server.port) == (200, b"ok")  # the honest client, during the attack
        assert server.counts.per_peer["127.0.0.1"] <= BOUNDS.max_per_peer
        assert server.counts.refused_peer >= 1000 - BOUNDS.max_per_peer
        started = time.monotonic()
        assert all(closed_by_server(s, 3.0) for s in idle)  # the refused at once, the held at the deadline
        assert time.monotonic() - started < BOUNDS.request_timeout + 2.0
        assert server.counts.timed_out >= 1
        assert get(server.port) == (200, b"ok")


def test_a_request_head_sent_one_byte_at_a_time_is_cut_off_at_the_deadline():
    with Server() as server, socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        started = time.monotonic()
        closed = False
        for byte in b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 100:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if closed_by_server(s, 0.1):
                closed = True
                break
        elapsed = time.monotonic() - started
        assert closed and BOUNDS.request_timeout - 0.1 <= elapsed < BOUNDS.request_timeout + 1.0, elapsed
        assert server.counts.timed_out == 1
        assert get(server.port) == (200, b"ok")


def test_a_kept_alive_connection_gets_the_same_deadline_for_its_next_request():
    with Server() as server, socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 200 " in s.recv(65536)
        for _ in range(30):  # a byte every 0.1 s: uvicorn's keep-alive timer alone restarts on each
            try:
                s.sendall(b"G")
            except (BrokenPipeError, ConnectionResetError):
                break
            if closed_by_server(s, 0.1):
                break
        else:
            pytest.fail("a trickling kept-alive connection was held past its deadline")
        assert server.counts.timed_out == 1


def test_only_requests_in_flight_count_against_the_overload_limit():
    with Server() as server, idle_connections(server.port, BOUNDS.max_per_peer - BOUNDS.max_in_flight - 1):
        results: list = []
        holders = [threading.Thread(target=lambda: results.append(get(server.port, "/hold", "127.0.0.3")))
                   for _ in range(BOUNDS.max_in_flight)]
        for t in holders:
            t.start()
        deadline = time.monotonic() + 5
        while server.holding < BOUNDS.max_in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        status, body = get(server.port)
        assert status == 503 and b"overloaded" in body
        server.release.set()
        for t in holders:
            t.join(5)
        assert results == [(200, b"held")] * BOUNDS.max_in_flight  # the held requests are unharmed
        assert get(server.port) == (200, b"ok")  # idle connections alone never trip the limit


def test_a_slow_body_is_cut_off_at_the_same_deadline():
    with Server() as server, socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
        started = time.monotonic()
        assert closed_by_server(s, BOUNDS.request_timeout + 1.0)
        assert time.monotonic() - started < BOUNDS.request_timeout + 1.0
        assert get(server.port) == (200, b"ok")


def test_bounds_must_be_positive():
    with pytest.raises(ValueError):
        HttpBounds(request_timeout=0)
    with pytest.raises(ValueError):
        HttpBounds(max_per_peer=0)
