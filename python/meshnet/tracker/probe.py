"""The tracker's own look at a node a client reports as failed (issue 35, finding 3): a Health
call to the node's shard service, over TLS pinned to the certificate it registered (plaintext
for a node registered without one, --insecure swarms). A failure report bans a node only when
this probe fails too; a node that answers keeps serving everyone but the reporter's route."""

from __future__ import annotations

import grpc

from meshnet.protocol.shard_client import ShardClient
from meshnet.wire import tracker as tt

PROBE_TIMEOUT_S = 1.0


def health_fails(node: tt.NodeInfo, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True unless `node` answers Health within `timeout` (unreachable, refused, hung, or any error)."""
    cert = node.tls_certificate.encode() if node.tls_certificate else None
    try:
        with ShardClient.dial(node.address, cert) as shard:
            shard.ping(timeout=timeout)
        return False
    except (grpc.RpcError, ValueError, OSError):
        return True
