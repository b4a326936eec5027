"""The Pieces service (meshnet.weights.v1): a published model's signed manifest and its parts'
pieces, for nodes fetching their range (issue 50, item 5). The tracker serves it beside the
Tracker service, on the same port and behind the same connection caps (its grpc.aio server).

Bounds, checked before anything is read from disk:
- the caller's bearer token must grant the node or the verifier role (UNAUTHENTICATED for no
  known token, PERMISSION_DENIED for another role);
- a request names a model, a part's file and a piece index; each is looked up in the manifests
  loaded at start (NOT_FOUND otherwise), so no request's text ever reaches the file system;
- at most `max_per_peer` pieces in flight from one address and `max_in_flight` in all
  (RESOURCE_EXHAUSTED past them); a piece is read on a worker thread and sent in 1 MiB chunks.

Only models whose manifest the tracker's own key signed, and whose artifact a certified entry
names, are loaded (`PublishedModels`): nothing is served for an uncertified model.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
from pathlib import Path
from typing import Callable, Iterable, Optional

import grpc

from meshnet.identity import requests
from meshnet.process import log
from meshnet.weights.manifest import MAX_MANIFEST_BYTES, Manifest, ManifestError, parse
from meshnet.weights.v1 import weights_pb2, weights_pb2_grpc

MANIFEST_FILE = "manifest.json"
CHUNK_BYTES = 1 << 20
HANDSHAKE_TIMEOUT_MS = 5000  # a node's Pieces port: a connection that has not finished TLS by then is closed
CONNECTION_IDLE_MS = 300_000  # and one with no call for this long (GOAWAY)
ROLES = frozenset({"node", "verifier"})


@dataclasses.dataclass(frozen=True)
class PieceLimits:
    max_per_peer: int = 8  # pieces in flight to one address
    max_in_flight: int = 64  # pieces in flight in all


@dataclasses.dataclass(frozen=True)
class Published:
    manifest: Manifest
    encoded: bytes  # the manifest as signed, served as is
    directory: Path  # where its parts are


class PublishedModels:
    """The models under `root` (one directory per model: manifest.json and the parts), loaded
    once: each manifest must be signed by `tracker_key` and name a certified artifact."""

    def __init__(self, root: Optional[Path], tracker_key: bytes, certified_artifacts: Iterable[str]) -> None:
        """`root` None: no model yet (`held` adds a node's one)."""
        self.models: dict[str, Published] = {}
        certified = set(certified_artifacts)
        for directory in sorted(p for p in root.iterdir() if p.is_dir()) if root and root.is_dir() else []:
            path = directory / MANIFEST_FILE
            try:
                encoded = path.read_bytes()[:MAX_MANIFEST_BYTES + 1]
                manifest = parse(encoded, tracker_key)
            except (OSError, ManifestError) as err:
                log("model_not_published", directory=str(directory), reason=str(err))
                continue
            if manifest.artifact not in certified:
                log("model_not_published", model=manifest.model, reason="no certified entry names its artifact")
                continue
            self.models[manifest.model] = Published(manifest, encoded, directory)

    @classmethod
    def held(cls, manifest_path: Path, parts_dir: Path, tracker_key: bytes) -> "PublishedModels":
        """A node's: the one model whose manifest it fetched (signed by `tracker_key`), serving
        only the parts it holds whole under `parts_dir`; ManifestError or OSError otherwise."""
        encoded = manifest_path.read_bytes()[:MAX_MANIFEST_BYTES + 1]
        manifest = parse(encoded, tracker_key)
        held = tuple(p for p in manifest.parts
                     if (parts_dir / p.file).is_file() and (parts_dir / p.file).stat().st_size == p.size)
        if not held:
            raise FileNotFoundError(f"{parts_dir} holds no part of {manifest.model}'s manifest whole")
        models = cls(None, tracker_key, ())
        models.models[manifest.model] = Published(dataclasses.replace(manifest, parts=held), encoded, parts_dir)
        return models

    def piece(self, model: str, file: str, index: int) -> bytes:
        """The piece's bytes from the part on disk; LookupError when the manifest has no such piece."""
        published = self.models.get(model)
        part = next((p for p in published.manifest.parts if p.file == file), None) if published else None
        if part is None or not 0 <= index < len(part.pieces):
            raise LookupError(f"model {model!r} has no piece {index} of a part {file!r}")
        offset, length = part.piece_span(index, published.manifest.piece_bytes)
        with (published.directory / part.file).open("rb") as f:
            return os.pread(f.fileno(), length, offset)


class PieceService(weights_pb2_grpc.PiecesServicer):
    def __init__(self, models: PublishedModels, role_of: Callable[[str], Optional[str]],
                 peer_of: Callable[[str], str], limits: PieceLimits = PieceLimits()) -> None:
        self._models, self._role_of, self._peer_of, self._limits = models, role_of, peer_of, limits
        self._in_flight: collections.Counter = collections.Counter()  # per peer; the event loop only
        self._total = 0

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        role = self._role_of(requests.bearer_token(tuple(context.invocation_metadata() or ())))
        if role is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown role token")
        if role not in ROLES:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"role {role!r} may not fetch pieces")

    async def Manifest(self, request, context):  # noqa: N802
        await self._authorize(context)
        published = self._models.models.get(request.model)
        if published is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no published model {request.model[:128]!r}")
        return weights_pb2.ManifestReply(manifest=published.encoded)

    async def Piece(self, request, context):  # noqa: N802
        await self._authorize(context)
        peer = self._peer_of(context.peer())
        if self._in_flight[peer] >= self._limits.max_per_peer or self._total >= self._limits.max_in_flight:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self._in_flight[peer]} pieces in flight to "
                                f"{peer}, {self._total} in all; retry later")
        self._in_flight[peer] += 1
        self._total += 1
        try:
            loop = asyncio.get_running_loop()
            try:
                data = await loop.run_in_executor(None, self._models.piece, request.model, request.file, request.index)
            except LookupError as err:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(err)[:300])
            for offset in range(0, len(data), CHUNK_BYTES):
                yield weights_pb2.PieceChunk(data=data[offset:offset + CHUNK_BYTES])
        finally:
            self._in_flight[peer] -= 1
            if self._in_flight[peer] <= 0:
                del self._in_flight[peer]
            self._total -= 1


class PieceServer:
    """A Pieces service on its own event-loop thread (a node's, serving its part to joining
    peers); the tracker adds PieceService to its own server instead."""

    def __init__(self, models: PublishedModels, role_of: Callable[[str], Optional[str]], listen: str,
                 tls: Optional[tuple[bytes, bytes]], limits: PieceLimits = PieceLimits()) -> None:
        import threading

        from meshnet.peers import grpc_peer_host

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="pieces")
        self._thread.start()

        async def start() -> int:
            self._server = grpc.aio.server(options=[
                ("grpc.max_concurrent_streams", limits.max_per_peer),
                ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),  # gRPC's default: 120 s
                ("grpc.max_connection_idle_ms", CONNECTION_IDLE_MS)])
            weights_pb2_grpc.add_PiecesServicer_to_server(PieceService(models, role_of, grpc_peer_host, limits),
                                                          self._server)
            if tls is None:
                port = self._server.add_insecure_port(listen)
            else:
                port = self._server.add_secure_port(listen, grpc.ssl_server_credentials([(tls[1], tls[0])]))
            if port == 0:
                raise OSError(f"cannot listen on {listen}")
            await self._server.start()
            return port

        self.port = asyncio.run_coroutine_threadsafe(start(), self._loop).result()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.stop(1.0), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
