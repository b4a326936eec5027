"""What the tests of connection caps ask of a raw socket (test-only; a testonly library)."""

from __future__ import annotations

import socket


def closed_by_server(s: socket.socket, wait: float) -> bool:
    """Whether the server has closed `s` (EOF or reset) within `wait` seconds."""
    s.settimeout(wait)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
