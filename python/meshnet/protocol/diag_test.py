"""Diag service over real gRPC on loopback: generated stubs, unary and bidi streaming."""

from concurrent import futures

import grpc
import pytest

from meshnet.protocol import diag


@pytest.fixture
def channel():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    diag.add_to_server(server, "diag-test-server")
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    server.stop(grace=None)


def test_ping_names_the_server(channel):
    result = diag.ping(channel, client="test")
    assert result.server == "diag-test-server"
    assert result.server_unix_nanos > 0
    assert result.round_trip_seconds >= 0


def test_echo_answers_every_frame_in_order(channel):
    payloads = [bytes([i % 256]) * (i * 37) for i in range(200)]
    answers = list(diag.echo(channel, payloads))
    assert [seq for seq, _ in answers] == list(range(200))
    assert [p for _, p in answers] == payloads


def test_empty_server_name_is_refused():
    with pytest.raises(ValueError):
        diag.DiagService("")


def test_unreachable_server_is_an_error():
    with grpc.insecure_channel("127.0.0.1:1") as ch:
        with pytest.raises(grpc.RpcError) as err:
            diag.ping(ch, timeout=2.0)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
