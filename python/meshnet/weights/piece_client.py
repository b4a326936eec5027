"""The fetching side of the Pieces service: a peer (the tracker, for now) as a `PieceSource`,
and the signed manifest fetched from the tracker. Every call carries the caller's role token
over TLS to the certificate the caller trusts (the tracker's, pinned by its invite).

A source reads at most one piece's length and one byte more: an oversized piece stops there and
fails the manifest's check in the fetcher, like a corrupted one.
"""

from __future__ import annotations

from typing import Optional

import grpc

from meshnet.identity.requests import TOKEN_METADATA
from meshnet.weights.manifest import MAX_MANIFEST_BYTES, Manifest, Part, parse
from meshnet.weights.v1 import weights_pb2, weights_pb2_grpc

PIECE_TIMEOUT_S = 60.0  # a piece not delivered within it is a stalled source


def channel(address: str, cert_pem: Optional[bytes], tls_name: Optional[str] = None) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", MAX_MANIFEST_BYTES + (1 << 16))]
    if cert_pem is None:
        return grpc.insecure_channel(address, options=options)
    if tls_name:
        options.append(("grpc.ssl_target_name_override", tls_name))
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=cert_pem), options=options)


def _metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((TOKEN_METADATA, f"Bearer {token}"),)


def fetch_manifest(chan: grpc.Channel, token: str, model: str, tracker_key: bytes, timeout: float = 30.0) -> Manifest:
    """The model's manifest, once signed by `tracker_key` (ManifestError otherwise)."""
    reply = weights_pb2_grpc.PiecesStub(chan).Manifest(weights_pb2.ManifestRequest(model=model),
                                                       metadata=_metadata(token), timeout=timeout)
    return parse(reply.manifest, tracker_key)


class GrpcPieceSource:
    def __init__(self, name: str, chan: grpc.Channel, token: str, manifest: Manifest,
                 timeout: float = PIECE_TIMEOUT_S) -> None:
        self.name, self._stub, self._token = name, weights_pb2_grpc.PiecesStub(chan), token
        self._manifest, self._timeout = manifest, timeout

    def piece(self, part: Part, index: int) -> bytes:
        _, length = part.piece_span(index, self._manifest.piece_bytes)
        call = self._stub.Piece(weights_pb2.PieceRequest(model=self._manifest.model, file=part.file, index=index),
                                metadata=_metadata(self._token), timeout=self._timeout)
        data = bytearray()
        for chunk in call:
            data += chunk.data
            if len(data) > length:  # oversized: no need to read more to know it is wrong
                call.cancel()
                break
        return bytes(data[:length + 1])
