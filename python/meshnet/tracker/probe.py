"""The tracker's own look at a node a client reports as failed (issue 35, finding 3): a Health
call to the node's shard service, over TLS pinned to the certificate it registered (plaintext
for a node registered without one, --insecure swarms). A failure report bans a node only when
this probe fails too; a node that answers keeps serving everyone but the reporter's route.

A probe that fails while this process is out of file descriptors says nothing about the node
(issue 55, finding 4: 1,500 idle connections to the tracker left it no socket to probe with, and
it banned a healthy node on a client's report): such a failure is not counted."""

from __future__ import annotations

import errno
import os
import resource

import grpc

from meshnet.protocol.shard_client import ShardClient
from meshnet.wire import tracker as tt

PROBE_TIMEOUT_S = 1.0
FD_HEADROOM = 16  # descriptors a probe may need (socket, TLS, gRPC's own); fewer free: out of files


def health_fails(node: tt.NodeInfo, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True unless `node` answers Health within `timeout` (unreachable, refused, hung, or any error),
    except when this process is (or was, when the probe failed) out of file descriptors: then
    nothing is known, and False. Out of them, it does not dial at all."""
    if out_of_files():  # nothing to learn, and gRPC aborts the process when a channel gets no descriptor
        return False
    cert = node.tls_certificate.encode() if node.tls_certificate else None
    try:
        with ShardClient.dial(node.address, cert) as shard:
            shard.ping(timeout=timeout)
        return False
    except (grpc.RpcError, ValueError, OSError):
        return not out_of_files()


def out_of_files() -> bool:
    """Whether this process has fewer than FD_HEADROOM descriptors left under its soft limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError as err:  # listing takes a descriptor too
        return err.errno in (errno.EMFILE, errno.ENFILE)
    return soft != resource.RLIM_INFINITY and used >= soft - FD_HEADROOM
