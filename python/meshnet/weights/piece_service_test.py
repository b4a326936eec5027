"""The Pieces service's caps, unit (a fake gRPC context per call, as loopback offers one source
address): pieces in flight are capped per peer and in all, refused RESOURCE_EXHAUSTED past
either, and counted out when a stream ends however it ends. Also: only manifests the tracker's
key signed, for a certified artifact, are loaded."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from meshnet.identity.keys import Identity
from meshnet.weights.piece_service import MANIFEST_FILE, PieceLimits, PieceService, PublishedModels
from meshnet.weights.v1 import weights_pb2
from meshnet.weights.weights_fixtures import published  # noqa: F401


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class FakeContext:
    """What the service reads of a call (a fake, named as such)."""

    def __init__(self, peer: str, token: str = "node-token") -> None:
        self._peer, self._token = peer, token

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self):
        return (("authorization", f"Bearer {self._token}"),)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def models_of(published, certified=True) -> PublishedModels:
    (published.parts_dir / MANIFEST_FILE).write_bytes(published.manifest.encode())
    return PublishedModels(published.parts_dir.parent, published.key.public_key,
                           [published.manifest.artifact] if certified else [])


def test_pieces_in_flight_are_capped_per_peer_and_in_all(published):
    service = PieceService(models_of(published), {"node-token": "node"}.get, lambda peer: peer.split(":")[1],
                           PieceLimits(max_per_peer=1, max_in_flight=2))
    part = published.manifest.parts[0]
    request = weights_pb2.PieceRequest(model="tiny", file=part.file, index=0)

    async def scenario() -> None:
        first = service.Piece(request, FakeContext("ipv4:10.0.0.1:1"))
        assert len((await first.__anext__()).data) > 0  # in flight until its stream ends
        with pytest.raises(Aborted) as same_peer:
            await service.Piece(request, FakeContext("ipv4:10.0.0.1:2")).__anext__()
        assert same_peer.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        second = service.Piece(request, FakeContext("ipv4:10.0.0.2:1"))
        await second.__anext__()
        with pytest.raises(Aborted) as full:
            await service.Piece(request, FakeContext("ipv4:10.0.0.3:1")).__anext__()
        assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "2 in all" in str(full.value)
        await first.aclose()  # a stream cancelled half-way gives its place back
        async for _ in second:
            pass
        assert [c async for c in service.Piece(request, FakeContext("ipv4:10.0.0.3:1"))]

    asyncio.run(scenario())


def test_only_signed_manifests_of_certified_artifacts_are_loaded(published, tmp_path):
    assert set(models_of(published).models) == {"tiny"}
    assert models_of(published, certified=False).models == {}
    assert PublishedModels(published.parts_dir.parent, Identity.generate().public_key,
                           [published.manifest.artifact]).models == {}
    assert PublishedModels(tmp_path / "absent", published.key.public_key, []).models == {}


class Stalling:
    """A node's published models whose every piece takes `seconds` to come (a fake peer that
    stalls, named as such)."""

    def __init__(self, models: PublishedModels, seconds: float) -> None:
        self._models, self.models, self._seconds = models, models.models, seconds

    def piece(self, model: str, file: str, index: int) -> bytes:
        import time

        time.sleep(self._seconds)
        return self._models.piece(model, file, index)


def test_a_peer_that_stalls_is_cut_at_its_deadline_and_the_part_comes_from_another(published, tmp_path):
    """Over real gRPC: a peer whose pieces never come in time costs each piece asked of it its
    deadline, then is passed over; the part arrives whole from the honest source."""
    import time

    from meshnet.weights.fetcher import fetch
    from meshnet.weights.part_download import PartDownload
    from meshnet.weights.piece_client import GrpcPieceSource, channel
    from meshnet.weights.piece_service import PieceServer
    from meshnet.weights.sources import DirectorySource

    server = PieceServer(Stalling(models_of(published), 5.0), {"t": "node"}.get, "127.0.0.1:0", None)
    chan = channel(f"127.0.0.1:{server.port}", None)
    try:
        stalled = GrpcPieceSource("stalled", chan, "t", published.manifest, timeout=0.5)
        honest = DirectorySource("seed", published.parts_dir, published.manifest)
        part = published.manifest.parts[0]
        started = time.monotonic()
        progress = fetch(PartDownload(tmp_path, published.manifest, part), [stalled, honest], parallel=2)
        assert progress.per_source == {"seed": part.size}
        assert time.monotonic() - started < 4.5  # its deadlines (0.5 s each), not the 5 s stall
        assert (tmp_path / part.file).read_bytes() == (published.parts_dir / part.file).read_bytes()
    finally:
        chan.close()
        server.stop()


def test_a_nodes_pieces_go_only_to_its_tokens_holders_and_only_the_parts_it_holds(published, tmp_path):
    """A node's own Pieces service (PublishedModels.held): the node token only, and only the part
    it holds whole; everything else refused with its status, an honest fetch served beside."""
    import shutil

    from meshnet.weights.piece_client import GrpcPieceSource, channel
    from meshnet.weights.piece_service import PieceServer
    from meshnet.weights.v1 import weights_pb2_grpc

    held_dir = tmp_path / "node"
    held_dir.mkdir()
    held, other = published.manifest.parts
    shutil.copy(published.parts_dir / held.file, held_dir / held.file)
    (held_dir / "m.manifest.json").write_bytes(published.manifest.encode())
    models = PublishedModels.held(held_dir / "m.manifest.json", held_dir, published.key.public_key)
    server = PieceServer(models, lambda token: "node" if token == "node-token" else None, "127.0.0.1:0", None)
    chan = channel(f"127.0.0.1:{server.port}", None)
    stub = weights_pb2_grpc.PiecesStub(chan)

    def code(token: str, file: str, index: int = 0) -> grpc.StatusCode:
        try:
            list(stub.Piece(weights_pb2.PieceRequest(model="tiny", file=file, index=index),
                            metadata=(("authorization", f"Bearer {token}"),), timeout=5))
            return grpc.StatusCode.OK
        except grpc.RpcError as err:
            return err.code()

    try:
        assert code("", held.file) == grpc.StatusCode.UNAUTHENTICATED
        assert code("client-token", held.file) == grpc.StatusCode.UNAUTHENTICATED
        assert code("node-token", other.file) == grpc.StatusCode.NOT_FOUND  # not held here
        assert code("node-token", "../" + held.file) == grpc.StatusCode.NOT_FOUND
        honest = GrpcPieceSource("node", chan, "node-token", published.manifest)
        offset, length = held.piece_span(1, published.manifest.piece_bytes)
        assert honest.piece(held, 1) == (held_dir / held.file).read_bytes()[offset:offset + length]
    finally:
        chan.close()
        server.stop()
