"""A typed client of one shard's service (meshnet.shard.v1.Shard): native types in and out.

Used by the node (its worker's Health and TakeWork), the route client (Seam, Results and Health
probes), the verifier (Commitments), the tracker's failure probe, the local swarm and the bench.
It speaks over a channel the caller made (`ShardClient(channel)`: the caller closes it) or one it
dials itself (`ShardClient.dial`: TLS pinned to the shard's registered certificate, with the
peers' channel options, as meshnet.identity.tls.pinned_channel; closed with the client).
Failures are the raw stub's: a call that fails or times out raises grpc.RpcError (the channel's
own errors, e.g. ValueError on a closed channel, pass through as well); a reply that does not
decode raises ProtocolError. No call is retried. Any thread may call; a stream's reader is the
one thread that iterates it.
"""

from __future__ import annotations

import queue
from typing import Iterator, Optional

import grpc

from meshnet.identity.requests import SUPERVISOR_METADATA
from meshnet.identity.tls import pinned_channel
from meshnet.protocol import seam, supervision
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.wire import seam as t
from meshnet.wire import tracker as tt

_CLOSE = object()


class SeamStream:
    """One Seam stream. Frames are encoded on the sender's thread and queued (at most
    `max_queued`) for gRPC to write; replies are read by iterating the stream."""

    def __init__(self, stub: shard_pb2_grpc.ShardStub, max_queued: int) -> None:
        self._frames: queue.Queue = queue.Queue(maxsize=max_queued)
        self._call = stub.Seam(iter(self._frames.get, _CLOSE))

    def send(self, frame: t.SeamFrame, timeout: Optional[float] = None) -> None:
        """Queues `frame`; queue.Full if no room was made within `timeout` seconds (None: wait)."""
        self._frames.put(seam.to_proto(frame), timeout=timeout)

    def end(self, timeout: Optional[float] = None) -> None:
        """Ends the sending side after the frames queued; 0 does not wait for room; queue.Full
        if there was none within `timeout` (the stream is stuck: `cancel` it)."""
        if timeout == 0:
            self._frames.put_nowait(_CLOSE)
        else:
            self._frames.put(_CLOSE, timeout=timeout)

    def cancel(self) -> None:
        self._call.cancel()

    def __iter__(self) -> Iterator[t.SeamReply]:
        """The replies in order; grpc.RpcError when the stream fails (CANCELLED after `cancel`)."""
        for reply in self._call:
            yield seam.from_proto(reply)


class ResultsStream:
    """One Results stream: the session's result frames, read by iterating."""

    def __init__(self, stub: shard_pb2_grpc.ShardStub, request: t.ResultsRequest) -> None:
        self._call = stub.Results(seam.to_proto(request))

    def cancel(self) -> None:
        self._call.cancel()

    def __iter__(self) -> Iterator[t.ResultFrame]:
        for frame in self._call:
            yield seam.from_proto(frame)


class ShardClient:
    def __init__(self, channel: grpc.Channel, *, owns_channel: bool = False) -> None:
        """Over `channel`; closed by `close` only when `owns_channel`."""
        self._channel = channel
        self._owns_channel = owns_channel
        self._stub = shard_pb2_grpc.ShardStub(channel)

    @classmethod
    def dial(cls, address: str, certificate: Optional[bytes]) -> "ShardClient":
        """A client over a channel of its own to `address`, trusting only `certificate` (PEM;
        plaintext when it is None: --insecure only)."""
        return cls(pinned_channel(address, certificate), owns_channel=True)

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> "ShardClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def health(self, timeout: float) -> t.Health:
        return supervision.health_in(self._stub.Health(shard_pb2.HealthRequest(), timeout=timeout))

    def ping(self, timeout: float) -> None:
        """Health with its reply unread: returns when the shard answers within `timeout`."""
        self._stub.Health(shard_pb2.HealthRequest(), timeout=timeout)

    def take_work(self, supervisor_token: str, timeout: float) -> tuple[tt.WorkEntry, ...]:
        """Tokens processed per route session since the last call (taken: reset); only the
        node's supervisor, proved by `supervisor_token`, is answered (else PERMISSION_DENIED)."""
        reply = self._stub.TakeWork(shard_pb2.TakeWorkRequest(), timeout=timeout,
                                    metadata=((SUPERVISOR_METADATA, supervisor_token),))
        return supervision.work_in(reply)

    def commitments(self, ticket: t.AuditTicket, start: int, count: int, timeout: float) -> tt.SignedCommitments:
        """What the hop committed to for the audit ticket's session, as it signed it (unchecked:
        verify the signature before decoding the body with protocol.commitments.decode_body)."""
        audit = shard_pb2.AuditTicket(body=ticket.body, signature=ticket.signature)
        request = shard_pb2.CommitmentsRequest(ticket=audit, start=start, count=count)
        reply = self._stub.Commitments(request, timeout=timeout)
        return tt.SignedCommitments(reply.body, reply.signature)

    def seam(self, max_queued: int) -> SeamStream:
        """Opens a Seam stream (the first frame of a session carries the receiver's ticket)."""
        return SeamStream(self._stub, max_queued)

    def results(self, request: t.ResultsRequest) -> ResultsStream:
        """Opens the Results stream of `request`'s session (on the route's last hop)."""
        return ResultsStream(self._stub, request)
