"""Issue 50, items 3 and 5: a certified model published by one command and fetched range by
range from the tracker. A tiny GGUF, a tracker made with --init's files, its Pieces service over
TLS beside the Tracker service; a node's fetcher gets the signed manifest, then its part from
the tracker and from a peer that corrupts pieces, and the part arrives whole. Every bad request
is refused with its exact status while an honest node is served beside it."""

from __future__ import annotations

import json

import grpc
import pytest

from meshnet.identity.keys import Identity
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.recipe.fingerprint import artifact_fingerprint
from meshnet.recipe.fixtures import write_tiny_llama
from meshnet.tracker.certified import load_models
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.publish_command import main as publish
from meshnet.tracker.registry import Registry
from meshnet.tracker.service import serve
from meshnet.tracker.state_dir import StateDir, init
from meshnet.weights.fetcher import fetch
from meshnet.weights.manifest import ManifestError
from meshnet.weights.part_download import PartDownload
from meshnet.weights.piece_client import GrpcPieceSource, channel, fetch_manifest
from meshnet.weights.piece_service import PublishedModels
from meshnet.weights.v1 import weights_pb2, weights_pb2_grpc


def certified_entry(gguf, model: str) -> dict:
    """The models.json entry //python:certify writes on a pass, made here by hand (the suite itself
    is certification's own test): a stand-in named as such."""
    return {"model": model, "architecture": "llama", "n_layer": 4, "artifact_fingerprint": artifact_fingerprint(gguf),
            "recipe_fingerprint": "sha256:" + "0" * 64,
            "certification": {"suite": "meshnet-certify-v1", "passed": True, "stand_in": "publish_test"}}


@pytest.fixture
def swarm(tmp_path):
    """(tracker address, role tokens, certificate PEM, ticket public key, state, gguf)."""
    state = StateDir(tmp_path / "tracker")
    init(state, ["localhost"], ["127.0.0.1"])
    gguf = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=4, n_embd=128, n_vocab=512, seed=9)
    state.models.write_text(json.dumps([certified_entry(gguf, "tiny")]))
    assert publish(["--state", str(state.root), "--gguf", str(gguf), "--model", "tiny", "--nodes", "2",
                    "--piece-mib", "0.0625"]) == 0
    key = Identity.from_pem(state.ticket_key.read_bytes())
    models = load_models(state.models)
    ledger = Ledger(state.ledger)
    tokens = json.loads(state.roles.read_text())
    cert, tls_key = state.tls_cert.read_bytes(), state.tls_key.read_bytes()
    server, port = serve(Registry(models), ledger, "127.0.0.1:0", tokens, key, tls=(cert, tls_key),
                         published=PublishedModels(state.published, key.public_key,
                                                   [m.artifact_fingerprint for m in models]))
    yield f"127.0.0.1:{port}", tokens, cert, key.public_key, state, gguf
    server.stop(grace=0).wait()
    ledger.close()


def honest_node_served(address: str, tokens: dict, cert: bytes) -> None:
    key = Identity.generate()
    with TrackerClient(address, tokens["node"], key, tracker_ca=cert, tls_name="localhost", timeout=5) as node:
        assert not node.heartbeat(key.node_id).status.ok  # answered


class Corrupting:
    """A peer that flips the first byte of every piece it sends (a fake inside a test)."""

    def __init__(self, honest: GrpcPieceSource) -> None:
        self.name, self._honest = "corrupting-peer", honest

    def piece(self, part, index):
        data = self._honest.piece(part, index)
        return bytes([data[0] ^ 1]) + data[1:]


def test_a_node_fetches_its_part_from_the_seed_past_a_corrupting_peer(swarm, tmp_path):
    address, tokens, cert, tracker_key, state, _ = swarm
    chan = channel(address, cert, "localhost")
    manifest = fetch_manifest(chan, tokens["node"], "tiny", tracker_key)
    seed = GrpcPieceSource("seed", chan, tokens["node"], manifest)
    bad: list[str] = []
    for part in manifest.parts:
        download = PartDownload(tmp_path / "node", manifest, part)
        fetch(download, [Corrupting(seed), seed], parallel=4, on_bad=lambda name, index: bad.append(name))
        assert (tmp_path / "node" / part.file).read_bytes() == (state.published / "tiny" / part.file).read_bytes()
    assert set(bad) == {"corrupting-peer"}
    chan.close()
    honest_node_served(address, tokens, cert)


def piece_call(address: str, cert: bytes, token: str, model: str = "tiny", file: str = "", index: int = 0):
    chan = channel(address, cert, "localhost")
    try:
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        list(weights_pb2_grpc.PiecesStub(chan).Piece(weights_pb2.PieceRequest(model=model, file=file, index=index),
                                                      metadata=metadata, timeout=5))
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as err:
        return err.code(), err.details()
    finally:
        chan.close()


def test_bad_piece_requests_are_refused_with_their_status(swarm):
    address, tokens, cert, tracker_key, _, _ = swarm
    chan = channel(address, cert, "localhost")
    part = fetch_manifest(chan, tokens["node"], "tiny", tracker_key).parts[0]
    chan.close()
    assert piece_call(address, cert, tokens["node"], file=part.file) == (grpc.StatusCode.OK, "")
    assert piece_call(address, cert, tokens["verifier"], file=part.file) == (grpc.StatusCode.OK, "")
    assert piece_call(address, cert, "", file=part.file)[0] == grpc.StatusCode.UNAUTHENTICATED
    assert piece_call(address, cert, tokens["client"], file=part.file) == (
        grpc.StatusCode.PERMISSION_DENIED, "role 'client' may not fetch pieces")
    for model, file, index in (("other", part.file, 0), ("tiny", "../../roles.json", 0), ("tiny", "roles.json", 0),
                               ("tiny", part.file, len(part.pieces))):
        code, details = piece_call(address, cert, tokens["node"], model, file, index)
        assert code == grpc.StatusCode.NOT_FOUND and "has no piece" in details, (file, details)
    honest_node_served(address, tokens, cert)


def test_a_manifest_from_another_key_is_refused_by_the_node(swarm):
    address, tokens, cert, _, _, _ = swarm
    chan = channel(address, cert, "localhost")
    with pytest.raises(ManifestError, match="signed by another key"):
        fetch_manifest(chan, tokens["node"], "tiny", Identity.generate().public_key)
    chan.close()


def test_nothing_uncertified_is_published_or_served(swarm, tmp_path, capsys):
    address, tokens, cert, tracker_key, state, gguf = swarm
    other = write_tiny_llama(tmp_path / "other.gguf", n_layer=4, n_embd=128, n_vocab=512, seed=10)
    with pytest.raises(SystemExit):
        publish(["--state", str(state.root), "--gguf", str(other), "--model", "tiny", "--nodes", "2"])
    assert "was certified from another file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        publish(["--state", str(state.root), "--gguf", str(other), "--model", "nameless", "--nodes", "2"])
    assert "has no certified entry named 'nameless'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        publish(["--state", str(state.root), "--gguf", str(gguf), "--model", "tiny", "--nodes", "2"])
    assert "is published already" in capsys.readouterr().err
    assert sorted(p.name for p in state.published.iterdir()) == ["tiny"]  # nothing half-made left
    # A published directory whose artifact no certified entry names is not served after a restart.
    served = PublishedModels(state.published, tracker_key, certified_artifacts=[])
    assert served.models == {}
