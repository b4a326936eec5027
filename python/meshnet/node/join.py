"""`node --join INVITE [--data-dir DIR] [--max-memory 6G]`: a node that joins with one command
(issue 50, item 4). Before the node starts as it always has, this:

1. makes or keeps its identity in DIR;
2. redeems the invite, the first time (identity/invites.py: the tracker is trusted only by the
   invite's pin), and keeps what it got in DIR: the trackers' addresses, their certificate, the
   node token (0600); a restart uses those and does not redeem again;
3. measures what it can offer: the memory it may hold (--max-memory, else what the kernel
   reports available) and the disk free under DIR;
4. asks the tracker what to serve (Assign): a model, a layer range, the part that holds it;
5. fetches that part from the tracker's Pieces service and the nodes serving it, each piece
   checked against the manifest the tracker's key signed, resuming from what DIR already holds,
   with progress on stderr; then measures whether it can hold it (its weights and the least KV,
   from the part's own header): if not, it removes it, tells the tracker, and is assigned another;
6. returns the node's usual flags for what it was assigned, its part as --gguf; every other
   flag given is kept (the operator's --threads, --listen, ...).

Declared figures are not trusted by the tracker over measured ones; here the node measures what
it can hold before it offers it. Exit status 2 with the reason when the tracker assigns nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Optional

import grpc

from meshnet.identity.invites import InviteError, decode
from meshnet.identity.keys import Identity
from meshnet.identity.tls import NODE_TLS_NAME, write_private
from meshnet.process import log, parse_size
from meshnet.protocol.invite_redemption import InviteRefusedByTracker, redeem
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.weights.fetcher import FetchError, Progress, fetch
from meshnet.weights.manifest import ManifestError
from meshnet.weights.part_download import PartDownload
from meshnet.weights.piece_client import GrpcPieceSource, channel, fetch_manifest
from meshnet.wire import tracker as tt

DEFAULT_DATA_DIR = Path.home() / ".meshnet" / "node"
MAX_REASSIGNMENTS = 3  # parts a node may find too large for its memory before it gives up


class Joined:
    """What DIR keeps of a redeemed invite."""

    def __init__(self, data_dir: Path) -> None:
        self.identity = data_dir / "identity.pem"
        self.tracker = data_dir / "tracker.json"  # {"trackers": [...], "tls_name": "..."}
        self.certificate = data_dir / "tracker_cert.pem"
        self.token = data_dir / "node.token"
        self.parts = data_dir / "parts"

    def exists(self) -> bool:
        return self.tracker.is_file() and self.certificate.is_file() and self.token.is_file()

    def trackers(self) -> tuple[list[str], str]:
        saved = json.loads(self.tracker.read_text())
        return list(saved["trackers"]), saved["tls_name"]


def available_memory() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def _redeemed(joined: Joined, invite_text: str, identity: Identity) -> None:
    if joined.exists():
        log("join", step="redeemed before", trackers=joined.trackers()[0])
        return
    invite = decode(invite_text)
    if invite.role != "node":
        raise InviteError(f"this invite is for the {invite.role} role, not a node")
    got = redeem(invite, identity)
    write_private(joined.certificate, got.tracker_certificate)
    write_private(joined.token, got.role_token.encode())
    write_private(joined.tracker, json.dumps({"trackers": list(got.trackers), "tls_name": got.tls_name}).encode())
    log("join", step="redeemed", trackers=list(got.trackers))


def _show(progress: Progress) -> None:
    print(f"fetching {progress.part}: {progress.done_bytes / (1 << 20):.1f} of {progress.total_bytes / (1 << 20):.1f} "
          f"MiB, {progress.rate / (1 << 20):.1f} MiB/s, from {', '.join(sorted(progress.per_source)) or '-'}",
          file=sys.stderr, flush=True)


def does_not_fit(part_path: Path, start: int, end: int, memory_bytes: int) -> Optional[str]:
    """Why the node cannot hold the part it fetched in the memory it offered (its weights and the
    least KV a node serves, as the node's own device budget counts them), or None."""
    from meshnet.node.device_budget import DoesNotFit, plan
    from meshnet.recipe.range_memory import range_memory

    offered = tt.Device("cpu", "the memory this node offered", memory_bytes, memory_bytes)
    try:
        plan(offered, range_memory(part_path, start, end, "f32"), layers=(start, end))
    except DoesNotFit as err:
        return str(err)
    return None


def _fetched(joined: Joined, reply: tt.AssignReply, chan, token: str, tracker_key: bytes):
    """The assigned part fetched and checked (from the tracker and the peers the reply names);
    (part, manifest path, last progress)."""
    manifest = fetch_manifest(chan, token, reply.model, tracker_key)
    part = manifest.part(reply.layers.start, reply.layers.end)
    if part is None or part.file != reply.part_file:
        raise ManifestError(f"the manifest of {reply.model} has no part {reply.part_file} for the assigned range")
    download = PartDownload(joined.parts, manifest, part)
    manifest_path = joined.parts / f"{part.file}.manifest.json"
    write_private(manifest_path, manifest.encode())  # re-checked against the tracker key when served
    if download.resumed_bytes:
        log("join", step="resuming", part=part.file, verified_bytes=download.resumed_bytes)
    peers = [(peer.node_id, channel(peer.pieces_address, peer.tls_certificate.encode(), NODE_TLS_NAME))
             for peer in reply.sources if peer.pieces_address and peer.tls_certificate]
    sources = [GrpcPieceSource("tracker", chan, token, manifest),
               *(GrpcPieceSource(name, peer_chan, token, manifest) for name, peer_chan in peers)]
    try:
        done = fetch(download, sources, on_progress=_show,
                     on_bad=lambda name, index: log("bad_piece", source=name, part=part.file, piece=index))
    finally:
        for _, peer_chan in peers:
            peer_chan.close()
    log("join", step="fetched", part=part.file, bytes=done.done_bytes, resumed_bytes=done.resumed_bytes,
        per_source=done.per_source, seconds=round(done.seconds, 2))
    return part, manifest_path


def join(invite_text: str, data_dir: Path, max_memory: Optional[int], device: str) -> list[str]:
    """Joins (steps 1-5 above); the flags that make the node serve its assignment. A part that
    turns out not to fit the memory offered is removed and refused, and the tracker asked again
    (at most MAX_REASSIGNMENTS times)."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    joined = Joined(data_dir)
    identity = Identity.load_or_create(joined.identity)
    _redeemed(joined, invite_text, identity)
    trackers, tls_name = joined.trackers()
    token, cert = joined.token.read_text().strip(), joined.certificate.read_bytes()
    memory = min(max_memory or available_memory(), available_memory())
    refused: list[str] = []
    with TrackerClient(trackers, token, identity, tracker_ca=cert, tls_name=tls_name or None) as client:
        tracker_key = client.tracker_key()
        for _ in range(MAX_REASSIGNMENTS + 1):
            offer = tt.AssignRequest(memory, shutil.disk_usage(data_dir).free, device, tuple(refused))
            reply = client.assign(offer)
            if reply.status is None or not reply.status.ok or reply.layers is None:
                raise LookupError(reply.status.message if reply.status else "the tracker answered no assignment")
            log("join", step="assigned", model=reply.model, layers=[reply.layers.start, reply.layers.end],
                part=reply.part_file, reason=reply.reason, offered_memory=offer.memory_bytes,
                offered_disk=offer.disk_free_bytes)
            chan = channel(client.address, cert, tls_name or None)
            try:
                part, manifest_path = _fetched(joined, reply, chan, token, tracker_key)
            finally:
                chan.close()
            problem = does_not_fit(joined.parts / part.file, part.start, part.end, memory)
            if problem is None:
                break
            log("join", step="does not fit", part=part.file, reason=problem)
            (joined.parts / part.file).unlink()
            manifest_path.unlink()
            refused.append(part.file)
        else:
            raise LookupError(f"none of the {len(refused)} parts the tracker assigned fits this node's memory")
    return ["--tracker", ",".join(trackers), "--token-file", str(joined.token), "--tracker-ca", str(joined.certificate),
            "--tracker-tls-name", tls_name, "--identity", str(joined.identity), "--gguf", str(joined.parts / part.file),
            "--model", reply.model, "--layers", f"{part.start}:{part.end}", "--backend", "gguf",
            "--pieces-manifest", str(manifest_path)]


def resolve(argv: list[str]) -> list[str]:
    """`argv` with --join (and --data-dir, --max-memory) replaced by the flags joining gives;
    exits 2 with the reason when joining fails."""
    parser = argparse.ArgumentParser(prog="node --join", add_help=False)
    parser.add_argument("--join", required=True, metavar="INVITE")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--max-memory", type=parse_size, metavar="SIZE")
    parser.add_argument("--device", default="cpu")
    known, rest = parser.parse_known_args(argv)
    pinned = [flag for flag in ("--tracker", "--gguf", "--model", "--layers", "--identity", "--token-file")
              if flag in rest]
    if pinned:
        parser.error(f"--join decides {', '.join(pinned)}: leave them out (or join by hand without --join)")
    try:
        flags = join(known.join, known.data_dir, known.max_memory, known.device)
    except grpc.RpcError as err:
        parser.exit(2, f"node --join: the tracker answered {err.code().name}: {err.details()}\n")
    except (InviteError, InviteRefusedByTracker, ManifestError, FetchError, LookupError, OSError, ValueError) as err:
        parser.exit(2, f"node --join: {err}\n")
    return flags + ["--device", known.device] + rest


def add_pieces_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pieces-manifest", type=Path,
                        help="serve the pieces of --gguf, a part of this manifest (signed by the tracker), to nodes "
                        "joining for the same range (--join sets it)")
    parser.add_argument("--pieces-listen", help="host:port of that Pieces service (default: --listen's host, port 0)")
    parser.add_argument("--cheat-pieces", action="store_true",
                        help="TESTS ONLY: serve every piece with its first byte flipped (joining peers must drop it)")


class ServedPieces:
    def __init__(self, server, address: str) -> None:
        self._server, self.address = server, address

    def stop(self) -> None:
        self._server.stop()


def serve_pieces(args: argparse.Namespace, token: str, tracker_key: bytes,
                 tls_pair: Optional[tuple[bytes, bytes]]) -> Optional[ServedPieces]:
    """The node's Pieces service for its part (with --pieces-manifest), for peers holding the node
    token; None without the flag."""
    from meshnet.weights.piece_service import PieceServer, PublishedModels

    if args.pieces_manifest is None:
        return None
    models = PublishedModels.held(args.pieces_manifest, args.gguf.parent, tracker_key)
    if args.cheat_pieces:
        models = _Corrupting(models)
    host = (args.pieces_listen or args.listen).rpartition(":")[0]
    listen = args.pieces_listen or f"{host}:0"
    server = PieceServer(models, lambda given: "node" if given and given == token else None, listen, tls_pair)
    log("pieces", address=f"{host}:{server.port}", model=next(iter(models.models)))
    return ServedPieces(server, f"{host}:{server.port}")


class _Corrupting:
    """--cheat-pieces (tests only): every piece served with its first byte flipped."""

    def __init__(self, models) -> None:
        self._models, self.models = models, models.models

    def piece(self, model: str, file: str, index: int) -> bytes:
        data = self._models.piece(model, file, index)
        return bytes([data[0] ^ 1]) + data[1:]
