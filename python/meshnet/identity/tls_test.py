"""Pinned TLS: a client trusts exactly the certificate it was given, and nothing in plaintext."""

from concurrent import futures

import grpc
import pytest

from meshnet.identity import certificates, tls
from meshnet.protocol import diag


@pytest.fixture
def server():
    cert, key = certificates.node_certificate()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    diag.add_to_server(srv, "pinned")
    port = srv.add_secure_port("127.0.0.1:0", tls.server_credentials(cert, key))
    srv.start()
    yield f"127.0.0.1:{port}", cert
    srv.stop(0)


def _ping(channel) -> str:
    with channel:
        return diag.ping(channel, timeout=5).server


def test_the_pinned_certificate_connects(server):
    address, cert = server
    assert _ping(tls.pinned_channel(address, cert)) == "pinned"


def test_another_certificate_or_plaintext_does_not(server):
    address, _ = server
    other, _ = certificates.node_certificate()
    with pytest.raises(grpc.RpcError) as err:
        _ping(tls.pinned_channel(address, other))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as err:
        _ping(tls.pinned_channel(address, None))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
