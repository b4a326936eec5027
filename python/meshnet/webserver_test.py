"""Issue 35, finding 1 on the tracker's and nodes' HTTP side: a few dozen silent connections
from one peer used to answer 503 to everyone (/status, /metrics); now that peer holds at most
its share while another peer is served."""

from __future__ import annotations

import socket

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from meshnet.webserver import BOUNDS, WebServer


def test_silent_connections_from_one_peer_leave_the_server_to_others():
    app = Starlette(routes=[Route("/status", lambda request: PlainTextResponse("up"))])
    server = WebServer(app, "127.0.0.1:0", name="test-web").start()
    idle = []
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(100)]
        honest = socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=("127.0.0.2", 0))
        honest.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := honest.recv(4096):
            reply += chunk
        honest.close()
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"up")
        assert server.counts.per_peer["127.0.0.1"] <= BOUNDS["max_per_peer"]
        assert server.counts.refused_peer >= 100 - BOUNDS["max_per_peer"]
    finally:
        for s in idle:
            s.close()
        server.stop()
