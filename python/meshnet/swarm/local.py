"""Starts a real tracker and real nodes as child processes on loopback.

Used by the newcomer's swarm command (run.py), integration tests and benchmarks. Every
process is a real `python -m meshnet.<role>.main` with its own gRPC server; nothing is faked.
Security is on as in production (ADR 0003): the tracker gets a TLS certificate, a ticket key and
a distinct token per role; every node gets its own identity key (so its node id is known before
it starts) and serves TLS. `insecure=True` turns TLS off (tickets stay on). `http=True` gives
the tracker its read-only /metrics and /status endpoints (`tracker.http_url`); `node_metrics=True`
gives every node /metrics (`node.metrics_url`); both on loopback port 0, off by default.
Invariant: `LocalSwarm.stop()` (or the context manager) ends every child it started.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import grpc

from meshnet.identity import certificates, tls
from meshnet.identity.keys import Identity
from meshnet.identity.roles import new_role_tokens
from meshnet.process import child_env
from meshnet.protocol.shard_client import ShardClient
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.recipe.certify import uncertified_entry
from meshnet.recipe.cut_model import even_cuts  # noqa: F401 - the swarm's split, re-exported for its callers
from meshnet.wire.seam import Health


def wait_for_port(proc: subprocess.Popen, port_file: Path, log: Path, timeout: float, what: str) -> int:
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log.exists() else ""
            raise RuntimeError(f"{what} did not come up (exit {proc.poll()}):\n{tail}")
        time.sleep(0.05)
    return int(port_file.read_text())


class TrackerProcess:
    def __init__(self, workdir: Path, models: list[dict], *, lease_seconds: float = 10.0,
                 ban_seconds: float = 30.0, max_ban_seconds: float = 300.0, db: Optional[Path] = None,
                 insecure: bool = False, host: str = "127.0.0.1", ticket_seconds: float = 600.0,
                 http: bool = False, prefix: Sequence[str] = (), relay: bool = False,
                 check_reachability: bool = False, audit_rate: Optional[float] = None,
                 audit_seed: Optional[int] = None, extra_args: Sequence[str] = (),
                 peer: Optional["TrackerProcess"] = None, ledger_url: Optional[str] = None) -> None:
        """`prefix` runs it under another command (e.g. `ip netns exec NS`); `relay`: it also
        serves the relay role on `host` (relay_address); `check_reachability`: it sends nodes it
        cannot reach to a relay (ADR 0007). `audit_rate`/`audit_seed`: the tracker's audit draw
        (ADR 0008; its own default rate when None). `extra_args`: more tracker flags (e.g.
        `--etcd H:P,H:P --etcd-prefix /p/`). `peer`: another tracker of the same swarm whose role
        tokens, TLS certificate and ticket key this one shares (replicated trackers, ADR 0011).
        `ledger_url`: a PostgreSQL ledger (--ledger) instead of the SQLite file `db`."""
        self.workdir, self.host, self.insecure, self.prefix = workdir, host, insecure, list(prefix)
        self.extra_args = list(extra_args)
        self.relay, self.relay_port, self.check_reachability = relay, 0, check_reachability
        self.audit_rate, self.audit_seed = audit_rate, audit_seed
        self.http = http  # serve /metrics and /status on `host` (see http_url)
        self.http_port = 0
        self.db = db or workdir / "tracker.db"
        self.ledger_url = ledger_url
        self.models_file = workdir / "models.json"
        self.models_file.write_text(json.dumps(models))
        self.roles = peer.roles if peer else new_role_tokens()
        self.roles_file = tls.write_private(workdir / "roles.json", json.dumps(self.roles).encode())
        self.token_files = {role: tls.write_private(workdir / f"{role}.token", token.encode())
                            for role, token in self.roles.items()}
        self.ticket_key = peer.ticket_key if peer else workdir / "tracker-ticket.key"
        Identity.load_or_create(self.ticket_key)  # made here, so trackers started together share it
        self.ca: Optional[bytes] = None  # the tracker's certificate, which its clients trust
        self.tls: Optional[tuple[Path, Path]] = None
        if peer:
            self.ca, self.tls = peer.ca, peer.tls
        elif not insecure:
            cert, key = certificates.self_signed("meshnet-tracker", ["localhost"], [host])
            self.ca = cert
            self.tls = (tls.write_private(workdir / "tracker.crt", cert), tls.write_private(workdir / "tracker.key", key))
        self.lease_seconds, self.ban_seconds, self.ticket_seconds = lease_seconds, ban_seconds, ticket_seconds
        self.max_ban_seconds = max_ban_seconds
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.log = workdir / "tracker.log"

    def enroll(self, role: str, public_key: bytes) -> None:
        """Enrolls `public_key` for `role` in the tracker's ledger, as the operator's `principals
        enroll` does (ADR 0017): before start, or taken within the tracker's 5 s sync. Only
        enrolled verifier keys count toward the audit quorum (tracker/audits.py)."""
        from meshnet.tracker.ledger.ledger import Ledger  # here: psycopg only for callers that enroll
        from meshnet.tracker.ledger.principals import Enrolment

        ledger = Ledger(self.ledger_url or self.db)
        try:
            ledger.enroll(Enrolment(public_key, role, enrolled_at=time.time()))
        finally:
            ledger.close()

    def client(self, role: str = "client", identity: Optional[Identity] = None, timeout: float = 10.0) -> TrackerClient:
        """A tracker client with `role`'s token and `identity` (a fresh key by default)."""
        return TrackerClient(self.address, self.roles[role], identity or Identity.generate(), tracker_ca=self.ca,
                             timeout=timeout)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def relay_address(self) -> str:
        """Where relayed nodes attach (relay=True and started)."""
        if not self.relay_port:
            raise RuntimeError("the tracker serves no relay (relay=False) or has not started")
        return f"{self.host}:{self.relay_port}"

    @property
    def http_url(self) -> str:
        """Where /metrics and /status are (http=True and started)."""
        if not self.http or not self.http_port:
            raise RuntimeError("the tracker serves no HTTP endpoints (http=False) or has not started")
        return f"http://{self.host}:{self.http_port}"

    def start(self) -> "TrackerProcess":
        """Starts the tracker on its port (a free one the first time)."""
        port_file = self.workdir / "tracker.port"
        port_file.unlink(missing_ok=True)
        cmd = [*self.prefix, sys.executable, "-m", "meshnet.tracker.main", "--listen", f"{self.host}:{self.port}",
               *(["--ledger", self.ledger_url] if self.ledger_url else ["--db", str(self.db)]),
               "--models", str(self.models_file), "--allow-uncertified", "--roles-file", str(self.roles_file), "--ticket-key",
               str(self.ticket_key), "--ticket-seconds", str(self.ticket_seconds),
               "--lease-seconds", str(self.lease_seconds), "--ban-seconds", str(self.ban_seconds),
               "--max-ban-seconds", str(self.max_ban_seconds),
               "--port-file", str(port_file)]
        cmd += ["--insecure"] if self.insecure else ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        http_port_file = self.workdir / "tracker.http.port"
        if self.http:
            http_port_file.unlink(missing_ok=True)
            cmd += ["--http-listen", f"{self.host}:{self.http_port}", "--http-port-file", str(http_port_file)]
        relay_port_file = self.workdir / "tracker.relay.port"
        if self.relay:
            relay_port_file.unlink(missing_ok=True)
            cmd += ["--relay", f"{self.host}:{self.relay_port}", "--relay-port-file", str(relay_port_file)]
        if self.check_reachability:
            cmd += ["--check-reachability"]
        if self.audit_rate is not None:
            cmd += ["--audit-rate", str(self.audit_rate)]
        if self.audit_seed is not None:
            cmd += ["--audit-seed", str(self.audit_seed)]
        cmd += self.extra_args
        self.proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        self.port = wait_for_port(self.proc, port_file, self.log, 60, "tracker")
        if self.http:  # written before the gRPC port file
            self.http_port = int(http_port_file.read_text())
        if self.relay:  # likewise
            self.relay_port = int(relay_port_file.read_text())
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, like a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> "TrackerProcess":
        """Starts it again after kill()/stop(), on the same port, ledger, keys and tokens (its
        registry starts empty: nodes register again)."""
        if self.proc and self.proc.poll() is None:
            raise RuntimeError("the tracker is still running")
        return self.start()

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout=30)
        return self.proc.returncode if self.proc else 0


class NodeProcess:
    def __init__(self, workdir: Path, tracker: TrackerProcess, gguf: Path, model: str, layers: tuple[int, int],
                 name: str, *, backend: str = "reference", max_sessions: int = 16, threads: int = 1,
                 worker_binary: Optional[Path] = None, host: str = "127.0.0.1", prefix: Sequence[str] = (),
                 max_kv_tokens: Optional[int] = None, metrics: bool = False, advertise: str = "",
                 extra_args: Sequence[str] = ()) -> None:
        """`prefix` runs the node under another command (e.g. `ip netns exec NS`); `host` is the
        address it listens on and, unless `advertise` (host:port) names another, advertises.
        `metrics`: serve /metrics on `host` (metrics_url). `extra_args`: more node flags (e.g.
        `--behind-nat --relay-via H:P`)."""
        self.advertise, self.extra_args = advertise, list(extra_args)
        self.workdir, self.tracker, self.gguf, self.model = workdir, tracker, gguf, model
        self.host, self.prefix, self.max_kv_tokens = host, list(prefix), max_kv_tokens
        self.worker_binary = worker_binary
        self.layers, self.name, self.backend = layers, name, backend
        self.identity_file = workdir / f"{name}.key"
        self.node_id = Identity.load_or_create(self.identity_file).node_id  # what the tracker will call it
        self.max_sessions, self.threads = max_sessions, threads
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.metrics, self.metrics_port = metrics, 0
        self.log = workdir / f"{name}.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Where the node's /metrics is (metrics=True and ready)."""
        if not self.metrics or not self.metrics_port:
            raise RuntimeError(f"node {self.name} serves no metrics (metrics=False) or is not ready")
        return f"http://{self.host}:{self.metrics_port}"

    def launch(self) -> "NodeProcess":
        port_file = self.workdir / f"{self.name}.port"
        port_file.unlink(missing_ok=True)
        self._port_file = port_file
        cmd = [*self.prefix, sys.executable, "-m", "meshnet.node.main", "--tracker", self.tracker.address,
               "--listen", f"{self.host}:0", "--token-file", str(self.tracker.token_files["node"]),
               "--identity", str(self.identity_file), "--gguf", str(self.gguf), "--model", self.model, "--layers",
               f"{self.layers[0]}:{self.layers[1]}", "--backend", self.backend,
               "--max-sessions", str(self.max_sessions), "--threads", str(self.threads), "--heartbeat-seconds", "0.5",
               "--drain-seconds", "5", "--port-file", str(port_file)]
        cmd += ["--insecure"] if self.tracker.insecure else ["--tracker-ca", str(self.tracker.tls[0])]
        if self.worker_binary is not None:
            cmd += ["--worker-binary", str(self.worker_binary)]
        if self.max_kv_tokens is not None:
            cmd += ["--max-kv-tokens", str(self.max_kv_tokens)]
        if self.advertise:
            cmd += ["--advertise", self.advertise]
        cmd += self.extra_args
        self._metrics_port_file = self.workdir / f"{self.name}.metrics.port"
        if self.metrics:
            self._metrics_port_file.unlink(missing_ok=True)
            cmd += ["--metrics-listen", f"{self.host}:0", "--metrics-port-file", str(self._metrics_port_file)]
        self.proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        return self

    def wait_ready(self, timeout: float = 300) -> "NodeProcess":
        self.port = wait_for_port(self.proc, self._port_file, self.log, timeout, f"node {self.name}")
        if self.metrics:  # written before the node's port file
            self.metrics_port = int(self._metrics_port_file.read_text())
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> Optional[int]:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode if self.proc else None


class LocalSwarm:
    """A tracker plus one node per range in `cuts`, all on loopback."""

    def __init__(self, workdir: Path, gguf: Path, cuts: Sequence[tuple[int, int]], *, model: str = "smollm2",
                 backend: str = "reference", lease_seconds: float = 3.0, max_sessions: int = 16,
                 threads: int = 1, worker_binary: Optional[Path] = None, host: str = "127.0.0.1",
                 node_hosts: Sequence[str] = (), node_prefixes: Sequence[Sequence[str]] = (),
                 max_kv_tokens: Optional[int] = None, insecure: bool = False, ban_seconds: float = 30.0,
                 max_ban_seconds: float = 300.0, http: bool = False, node_metrics: bool = False,
                 node_advertise: Sequence[str] = (), node_ggufs: Sequence[Path] = (), node_args: Sequence[str] = (),
                 audit_rate: Optional[float] = None, control_plane=None,
                 matmul_activations: Optional[str] = None, device: str | Sequence[str] = "cpu",
                 tracker_args: Sequence[str] = ()) -> None:
        """`node_hosts`/`node_prefixes` (one per cut) place nodes elsewhere, e.g. in network
        namespaces; by default every process is on loopback. `node_ggufs` (one per cut) are
        byte-identical copies of `gguf` each node reads instead, so nodes share no page cache, as
        on separate machines. `node_advertise` (one host:port per
        cut) is the address each node registers instead of its own (a delay proxy in front of
        it; see NodeProcess.port for the bound one). `insecure`: plaintext links.
        `ban_seconds`/`max_ban_seconds`: how long the tracker avoids a node reported failed.
        `http`: the tracker serves /metrics and /status; `node_metrics`: every node serves /metrics.
        `node_args`: more flags for every node; `audit_rate`: the tracker's (ADR 0008).
        `control_plane`: the trackers to use instead of one TrackerProcess (e.g. a
        swarm.replicated.ReplicatedTrackers: nodes then get every tracker's address).
        `matmul_activations`: the model's recipe's ("f32": quantized weights dequantized, ADR 0012;
        None: the backend's default), in the tracker's entry and on every node. `device`: every
        gguf node's worker computes there ("vulkan0": `worker_binary` must link Vulkan), and the
        tracker's entry is certified on that compute backend (ADR 0014); a list (one per cut)
        puts each node on its own device, and the entry then names every backend and their mix
        (ADR 0015: what //python:certify's cross-backend run serves). `tracker_args`: more
        tracker flags (e.g. `--route-lease-seconds 6`)."""
        workdir.mkdir(parents=True, exist_ok=True)
        if backend == "gguf" and worker_binary is None:
            raise ValueError("a gguf swarm needs the worker binary (cpp/worker)")
        self.worker_binary = worker_binary
        self.workdir, self.gguf, self.model, self.backend = workdir, gguf, model, backend
        self.node_devices = [device] * len(cuts) if isinstance(device, str) else list(device)
        if len(self.node_devices) != len(cuts):
            raise ValueError(f"{len(self.node_devices)} devices for {len(cuts)} nodes")
        self.tracker = control_plane or TrackerProcess(
            workdir, [uncertified_entry(gguf, model, backend, matmul_activations,
                                       self.node_devices or ([device] if isinstance(device, str) else []))],
            lease_seconds=lease_seconds, host=host,
            insecure=insecure,
            ban_seconds=ban_seconds, max_ban_seconds=max_ban_seconds, http=http, audit_rate=audit_rate,
            extra_args=tracker_args)
        self.insecure, self.node_metrics = insecure, node_metrics
        self.node_args = [*(["--matmul-activations", matmul_activations] if matmul_activations else []), *node_args]
        self.cuts, self.max_sessions, self.threads = list(cuts), max_sessions, threads
        self.node_hosts, self.node_prefixes, self.max_kv_tokens = list(node_hosts), list(node_prefixes), max_kv_tokens
        self.node_advertise, self.node_ggufs = list(node_advertise), list(node_ggufs)
        self.nodes: dict[str, NodeProcess] = {}  # by node id (derived from each node's key)
        self.ids: dict[str, str] = {}  # node name ("node-0") -> node id
        self._channels: dict[tuple[str, str, str], grpc.Channel] = {}  # see shard_channels()
        self._probe_client: Optional[TrackerClient] = None

    def start(self) -> "LocalSwarm":
        self.tracker.start()
        for i, cut in enumerate(self.cuts):
            self.add_node(f"node-{i}", cut, wait=False, host=self.node_hosts[i] if self.node_hosts else "127.0.0.1",
                          prefix=self.node_prefixes[i] if self.node_prefixes else (),
                          advertise=self.node_advertise[i] if self.node_advertise else "",
                          gguf=self.node_ggufs[i] if self.node_ggufs else None, device=self.node_devices[i])
        for node in self.nodes.values():
            node.wait_ready()
        return self

    def add_node(self, name: str, layers: tuple[int, int], wait: bool = True, host: str = "127.0.0.1",
                 prefix: Sequence[str] = (), advertise: str = "", gguf: Optional[Path] = None,
                 extra_args: Sequence[str] = (), device: Optional[str] = None) -> NodeProcess:
        """`device`: where its worker computes (default: the first cut's device)."""
        device = device or self.node_devices[0]
        node = NodeProcess(self.workdir, self.tracker, gguf or self.gguf, self.model, layers, name, backend=self.backend,
                           max_sessions=self.max_sessions, threads=self.threads, worker_binary=self.worker_binary,
                           host=host, prefix=prefix, max_kv_tokens=self.max_kv_tokens,
                           metrics=self.node_metrics, advertise=advertise,
                           extra_args=[*self.node_args, *(["--device", device] if device != "cpu" else []),
                                       *extra_args]).launch()
        self.nodes[node.node_id] = node
        self.ids[name] = node.node_id
        return node.wait_ready() if wait else node

    def client(self) -> TrackerClient:
        """A tracker client with the client role and a fresh identity."""
        return self.tracker.client()

    def shard_channels(self, direct: bool = False) -> dict[str, grpc.Channel]:
        """A channel to every registered node's shard service, pinned to its registered
        certificate (for Health probes), by node id. `direct`: dial the address a node of this
        swarm is bound to, not the one it advertises (past a delay proxy). Channels and the
        tracker client behind them are made once and reused (probes poll); stop() closes them."""
        if self._probe_client is None:
            self._probe_client = self.client()
        out = {}
        for n in self._probe_client.coverage(self.model).nodes:
            address = self.nodes[n.node_id].address if direct and n.node_id in self.nodes else n.address
            key = (n.node_id, address, n.tls_certificate)
            if key not in self._channels:
                self._channels[key] = tls.pinned_channel(address, n.tls_certificate.encode() or None)
            out[n.node_id] = self._channels[key]
        return out

    def health(self) -> dict[str, Health]:
        """Every registered node's Health reply, by node name ("node-0", ...)."""
        names = {node_id: name for name, node_id in self.ids.items()}
        return {names.get(node_id, node_id): ShardClient(channel).health(timeout=5)
                for node_id, channel in self.shard_channels().items()}

    def devices(self) -> dict[str, str]:
        """Where every registered node computes, as its worker reports it (Health), by node name."""
        return {name: f"{reply.device} ({reply.device_description})" if reply.device_description else reply.device
                for name, reply in sorted(self.health().items())}

    def stop(self) -> None:
        for channel in self._channels.values():
            channel.close()
        if self._probe_client is not None:
            self._probe_client.close()
        for node in self.nodes.values():
            node.stop()
        self.tracker.stop()

    def __enter__(self) -> "LocalSwarm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
