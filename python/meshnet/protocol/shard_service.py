"""The serving side of meshnet.shard.v1.Shard in native types: a shard written in Python (the
reference backend) implements `ShardHandler` and mounts it with `add_to_server`.

The adapter decodes each request and encodes each reply with the seam and supervision codecs,
at the same points the handler would have: a request that does not decode raises from the call
(gRPC answers UNKNOWN), as before. Seam frames reach the handler undecoded (`ReceivedFrame`): the
handler counts their size and decodes each itself, answering a frame that does not decode with
a status instead of ending the stream. Commitments is not served (UNIMPLEMENTED). Threads:
gRPC's; the adapter keeps no state.
"""

from __future__ import annotations

from typing import Generator, Iterator, Protocol, Sequence

import grpc

from meshnet.protocol import seam, supervision
from meshnet.shard.v1 import shard_pb2_grpc
from meshnet.wire import seam as t
from meshnet.wire import tracker as tt


class ReceivedFrame:
    """One SeamFrame as it arrived: its serialized size, decoded on demand."""

    __slots__ = ("_message",)

    def __init__(self, message) -> None:
        self._message = message

    @property
    def size(self) -> int:
        """Serialized bytes (Health's seam_bytes_in)."""
        return self._message.ByteSize()

    def decode(self) -> t.SeamFrame:
        """The native frame; ProtocolError if it is malformed (its version is not checked here)."""
        frame = seam.from_proto(self._message)
        assert isinstance(frame, t.SeamFrame)
        return frame


class ShardHandler(Protocol):
    """What a Python shard implements; `context` is gRPC's (metadata, abort, is_active)."""

    def hello(self, request: t.HelloRequest, context: grpc.ServicerContext) -> t.HelloReply: ...

    def health(self, context: grpc.ServicerContext) -> t.Health: ...

    def take_work(self, context: grpc.ServicerContext) -> Sequence[tt.WorkEntry]: ...

    def seam_stream(self, frames: Iterator[ReceivedFrame],
                    context: grpc.ServicerContext) -> Generator[t.SeamReply, None, None]: ...

    def results_stream(self, request: t.ResultsRequest,
                       context: grpc.ServicerContext) -> Generator[t.ResultFrame, None, None]: ...


class _Servicer(shard_pb2_grpc.ShardServicer):
    def __init__(self, handler: ShardHandler) -> None:
        self._handler = handler

    def Hello(self, request, context):  # noqa: N802 (gRPC method name)
        return seam.to_proto(self._handler.hello(seam.from_proto(request), context))

    def Health(self, request, context):  # noqa: N802
        return supervision.health_out(self._handler.health(context))

    def TakeWork(self, request, context):  # noqa: N802
        return supervision.work_out(self._handler.take_work(context))

    def Seam(self, request_iterator, context):  # noqa: N802
        replies = self._handler.seam_stream(map(ReceivedFrame, request_iterator), context)
        try:
            for reply in replies:
                yield seam.to_proto(reply)
        finally:
            replies.close()  # the handler's own cleanup runs when gRPC ends the call

    def Results(self, request, context):  # noqa: N802
        frames = self._handler.results_stream(seam.from_proto(request), context)
        try:
            for frame in frames:
                yield seam.to_proto(frame)
        finally:
            frames.close()


def add_to_server(server: grpc.Server, handler: ShardHandler) -> None:
    """Mounts `handler` as the server's Shard service."""
    shard_pb2_grpc.add_ShardServicer_to_server(_Servicer(handler), server)
