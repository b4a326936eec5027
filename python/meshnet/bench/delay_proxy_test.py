"""The delay proxy: a measured one-way delay within 10% of the setting (5, 10 and 25 ms), the
rate limit holds a bulk transfer to the configured rate, and bytes pass unchanged."""

from __future__ import annotations

import socket
import statistics
import threading
import time

import pytest

from meshnet.bench.delay_proxy import DelayProxy


class Echo:
    """A TCP server that stamps when each message arrives (one-way timing on one clock)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.arrivals: list[tuple[float, bytes]] = []
        self.received = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            data = conn.recv(1 << 16)
            if not data:
                break
            self.arrivals.append((time.monotonic(), data))
            self.received += data
            conn.sendall(data[:1])  # a byte back per chunk, for the reverse direction


@pytest.mark.parametrize("delay_ms", [5.0, 10.0, 25.0])
def test_one_way_delay_is_within_ten_percent(delay_ms):
    echo = Echo()
    with DelayProxy(delay_ms, target=("127.0.0.1", echo.port)) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port))
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        one_way, round_trip = [], []
        for i in range(20):
            sent = time.monotonic()
            client.sendall(b"%03d" % i)
            assert client.recv(1)  # back through the proxy: a round trip
            round_trip.append(time.monotonic() - sent)
            one_way.append(echo.arrivals[-1][0] - sent)
            time.sleep(0.002)
        client.close()
    measured = statistics.median(one_way) * 1000
    print(f"setting {delay_ms} ms: one-way p50 {measured:.2f} ms, round trip p50 "
          f"{statistics.median(round_trip) * 1000:.2f} ms")
    assert abs(measured - delay_ms) <= 0.1 * delay_ms, measured
    assert abs(statistics.median(round_trip) * 1000 - 2 * delay_ms) <= 0.2 * delay_ms


def test_rate_limit_and_bytes_unchanged():
    echo = Echo()
    payload = bytes(range(256)) * 1024  # 256 KiB
    with DelayProxy(1.0, rate_mbit=20, target=("127.0.0.1", echo.port)) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port))
        started = time.monotonic()
        client.sendall(payload)
        deadline = time.monotonic() + 10
        while len(echo.received) < len(payload) and time.monotonic() < deadline:
            time.sleep(0.005)
        elapsed = echo.arrivals[-1][0] - started
        client.close()
    assert bytes(echo.received) == payload
    ideal = len(payload) * 8 / 20e6  # 0.105 s at 20 Mbit/s
    assert ideal * 0.9 <= elapsed <= ideal * 1.5 + 0.05, (elapsed, ideal)
