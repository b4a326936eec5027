"""Test only: a relay that changes one bit of what it forwards to the nodes behind it.

`python tampering_relay.py LISTEN PUBLIC_HOST CERT KEY TOKEN_FILE PORT_FILE` serves the relay
role like the tracker's (same TLS, same node token), but flips the lowest bit of the 5000th byte
that each connection's peer sends toward the node, and logs each change it makes
({"event": "tampered", ...} on stderr). The multi-host test checks that the change is caught
(TLS fails the record, the hop fails over) and that no token ever differs.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from meshnet.process import log, stop_on_signals, write_port_file
from meshnet.relay.server import RelayServer

AT_BYTE = 5000


class TamperingRelay(RelayServer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._seen: dict[int, int] = {}  # bytes seen per forwarding task (all on the relay's loop)
        self.tampered = 0

    def forward_to_node(self, data: bytes) -> bytes:
        key = id(asyncio.current_task())
        start = self._seen.get(key, 0)
        self._seen[key] = start + len(data)
        if start <= AT_BYTE < start + len(data):
            at = AT_BYTE - start
            data = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]
            self.tampered += 1
            log("tampered", at_byte=AT_BYTE, total=self.tampered)
        return data


def main(argv: list[str]) -> int:
    listen, public_host, cert, key, token_file, port_file = argv
    relay = TamperingRelay(listen, public_host, tls=(Path(cert).read_bytes(), Path(key).read_bytes()),
                           token=Path(token_file).read_text().strip()).start()
    stop = stop_on_signals()
    write_port_file(Path(port_file), relay.port)
    stop.wait()
    relay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
