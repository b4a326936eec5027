"""The meshnet.diag.v1 service: liveness (`Ping`) and an in-order bidirectional `Echo` stream.

Servers of every role mount `DiagService` next to their main service; operators and tests use
`ping` and `echo` to check a peer is reachable and answers in order. Invariant: `Echo` answers
each frame exactly once, in arrival order, with the same sequence number and payload.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterable, Iterator

import grpc

from meshnet.diag.v1 import diag_pb2, diag_pb2_grpc


@dataclasses.dataclass(frozen=True)
class PingResult:
    server: str  # the name the server was started with
    server_unix_nanos: int  # the server's clock when it answered
    round_trip_seconds: float  # measured by the caller


class DiagService(diag_pb2_grpc.DiagServicer):
    """gRPC servicer; thread-safe (it keeps no mutable state)."""

    def __init__(self, server_name: str) -> None:
        if not server_name:
            raise ValueError("server_name must be non-empty")
        self._server_name = server_name

    def Ping(self, request, context):  # noqa: N802 (gRPC method name)
        return diag_pb2.PingReply(server=self._server_name, unix_nanos=time.time_ns())

    def Echo(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        for frame in request_iterator:
            yield diag_pb2.EchoFrame(seq=frame.seq, payload=frame.payload)


def add_to_server(server: grpc.Server, server_name: str) -> None:
    diag_pb2_grpc.add_DiagServicer_to_server(DiagService(server_name), server)


def ping(channel: grpc.Channel, client: str = "meshnet", timeout: float = 5.0) -> PingResult:
    stub = diag_pb2_grpc.DiagStub(channel)
    started = time.perf_counter()
    reply = stub.Ping(diag_pb2.PingRequest(client=client), timeout=timeout)
    return PingResult(reply.server, reply.unix_nanos, time.perf_counter() - started)


def echo(channel: grpc.Channel, payloads: Iterable[bytes], timeout: float = 30.0) -> Iterator[tuple[int, bytes]]:
    """Streams `payloads` on one Echo stream; yields (seq, payload) as answers arrive."""
    stub = diag_pb2_grpc.DiagStub(channel)
    frames = (diag_pb2.EchoFrame(seq=i, payload=p) for i, p in enumerate(payloads))
    for answer in stub.Echo(frames, timeout=timeout):
        yield answer.seq, answer.payload
