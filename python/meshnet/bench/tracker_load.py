"""`tools/bazel run //python:tracker_load -- --out DIR [--backend embedded|etcd|both]`: how much
a tracker takes (issue 20).

A real tracker process (TLS, role tokens, signed requests, tickets: as deployed) and simulated
nodes: lightweight registrations with no model, each with its own Ed25519 identity, signing its
own Register and Heartbeat calls like a real node. For each backend (`--backend`: the embedded
in-memory registry, or etcd: a real 3-member cluster on loopback ports, etcd_cluster.py, with the
tracker's `--etcd` on it) and each node count (`--nodes`, default 100, 1,000, 10,000) the harness
registers that many nodes (spread over 3 ranges of a 30-layer model; each starts heartbeating
once registered, every `--heartbeat-seconds`, so the offered rate is nodes / that), and then, for
each route rate (`--route-rates`, route opens per second), opens and closes routes at that rate
for `--seconds` and records OpenRoute and CloseRoute latency (p50, p99), the opens done per
second, the heartbeats answered per second and their p99, the tracker's CPU (percent of one core)
and RSS, and etcd's (summed over its members). Heartbeats come from `--heartbeat-threads` and
routes from `--route-threads` clients (16 each), each sending as scheduled or, when behind, at
once. The knee is the first route rate whose OpenRoute p99 passes `--knee-ms` or that the tracker
cannot keep up with (fewer than 90% of the offered opens per second done). Registration is
bounded (`--register-limit-seconds`): a node count that cannot register in time is recorded with
how far it got, and its route rates are not run. `--profile` runs the tracker under
tracker_profile.py and adds, per route rate, where its request threads spent their time.
Results: DIR/scale.json and a table per backend on stdout.

The load generator runs on the same machine as the tracker (and etcd), so all share its cores;
the figures are this machine's, with the generator's own CPU reported beside the tracker's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Optional

import grpc
import psutil

from meshnet.identity.keys import Identity
from meshnet.process import log
from meshnet.swarm.local import TrackerProcess
from meshnet.tracker.store.etcd_cluster import EtcdCluster
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, ProtocolVersion
from meshnet.wire.status import StatusCode

MODEL = {"model": "load-model", "architecture": "llama", "n_layer": 30, "artifact_fingerprint": "sha256:load",
         "recipe_fingerprint": "sha256:load-recipe"}
RANGES = [(0, 10), (10, 20), (20, 30)]
BACKENDS = {"embedded": "in-memory registry, SQLite ledger",
            "etcd": "3-member etcd cluster on loopback ports (one disk), SQLite ledger"}
PROGRESS_EVERY_S = 10.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1000, 2)


def node_info(identity: Identity, i: int) -> tt.NodeInfo:
    start, end = RANGES[i % len(RANGES)]
    return tt.NodeInfo(identity.node_id, f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}:7000",
                       tt.BackendKind.GGUF, MODEL["model"], "llama", Fingerprints("sha256:load", "sha256:load-recipe"),
                       "", tt.LayerRange(start, end), tt.Capacity(16, 32768, 0, 2048), 30, identity.public_key, "")


class Nodes:
    """`count` simulated nodes heartbeating from a few client threads (one channel each); a node
    heartbeats only once its registration was accepted."""

    def __init__(self, tracker: TrackerProcess, count: int, heartbeat_seconds: float, threads: int) -> None:
        self._tracker, self._period, self._threads_n = tracker, heartbeat_seconds, threads
        self.identities = [Identity.generate() for _ in range(count)]
        self.registered = bytearray(count)  # 1 once its Register was answered OK
        self._clients = [tracker.client("node", identity=None, timeout=30) for _ in range(threads)]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.beats: list[tuple[float, float]] = []  # (time answered, latency s)
        self.beat_errors = 0  # heartbeats that failed (RPC error)
        self.lapsed = 0  # heartbeats answered NOT_FOUND: the node's lease had lapsed
        self.register_refused: dict[str, int] = {}  # status code (or RPC error) -> registrations refused

    def register(self, limit_s: float) -> tuple[float, int]:
        """Registers every node, logging progress, for at most `limit_s`: (seconds, registered)."""
        started = time.perf_counter()
        give_up = threading.Event()

        def register_slice(k: int) -> None:
            with self._tracker.client("node", identity=None, timeout=30) as client:
                for i in range(k, len(self.identities), self._threads_n):
                    if give_up.is_set():
                        return
                    client.identity = self.identities[i]
                    try:
                        reply = client.register(tt.RegisterRequest(ProtocolVersion(1, 0),
                                                                   node_info(self.identities[i], i)))
                        problem = None if reply.status.ok else reply.status.code.name
                    except grpc.RpcError as err:
                        problem = f"rpc {err.code().name}"
                    with self._lock:
                        if problem is None:
                            self.registered[i] = 1
                        else:
                            self.register_refused[problem] = self.register_refused.get(problem, 0) + 1

        with ThreadPoolExecutor(self._threads_n) as pool:
            pending = {pool.submit(register_slice, k) for k in range(self._threads_n)}
            while pending:
                _, pending = wait(pending, timeout=PROGRESS_EVERY_S)
                elapsed = time.perf_counter() - started
                log("load_registering", registered=sum(self.registered), of=len(self.identities),
                    seconds=round(elapsed, 1), refused=self.register_refused, heartbeats=len(self.beats))
                if pending and elapsed > limit_s:
                    give_up.set()
        for future in pending:
            future.result()
        return time.perf_counter() - started, sum(self.registered)

    @property
    def offered_per_second(self) -> float:
        return len(self.identities) / self._period

    def start(self) -> None:
        for k in range(len(self._clients)):
            thread = threading.Thread(target=self._beat, args=(k,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _beat(self, k: int) -> None:
        client = self._clients[k]
        mine = range(k, len(self.identities), len(self._clients))
        interval = self._period / max(1, len(mine))
        next_at = time.perf_counter()
        while not self._stop.is_set():
            for i in mine:
                next_at += interval
                delay = next_at - time.perf_counter()
                if delay > 0 and self._stop.wait(delay):
                    return
                if not self.registered[i]:
                    continue
                client.identity = identity = self.identities[i]
                started = time.perf_counter()
                try:
                    reply = client.heartbeat(identity.node_id, tt.Load())
                    done = time.perf_counter()
                    with self._lock:
                        self.beats.append((done, done - started))
                        self.lapsed += reply.status.code == StatusCode.NOT_FOUND
                except grpc.RpcError:
                    with self._lock:
                        self.beat_errors += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        for client in self._clients:
            client.close()


def open_routes(tracker: TrackerProcess, rate: float, seconds: float, threads: int) -> dict:
    """Opens (and closes) routes at `rate` per second, as scheduled over `seconds`, from `threads`
    clients; OpenRoute and CloseRoute latencies (from sending), how late the opens were sent
    against the schedule (a client behind it sends at once), and the opens done per second. No
    open is sent after 2 * `seconds`: a tracker that cannot keep up leaves some undone."""
    latencies: list[float] = []
    closes: list[float] = []
    late: list[float] = []
    failures: dict[str, int] = {}
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds
    cutoff = deadline + seconds

    def client_loop(k: int) -> None:
        with tracker.client("client", timeout=30) as client:
            period = threads / rate
            next_at = time.perf_counter() + k * period / threads
            while next_at < deadline and time.perf_counter() < cutoff:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                started = time.perf_counter()
                with lock:
                    late.append(max(0.0, started - next_at))
                next_at += period
                try:
                    reply = client.open_route(tt.OpenRouteRequest(MODEL["model"], "load", 256))
                    problem = None if reply.status.ok else reply.status.code.name
                except grpc.RpcError as err:
                    reply, problem = None, f"rpc {err.code().name}"
                elapsed = time.perf_counter() - started
                with lock:
                    if problem is None:
                        latencies.append(elapsed)
                    else:
                        failures[problem] = failures.get(problem, 0) + 1
                if problem is None and reply.session is not None:
                    started = time.perf_counter()
                    try:
                        client.close_route(reply.session)
                        with lock:
                            closes.append(time.perf_counter() - started)
                    except grpc.RpcError:
                        pass

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(client_loop, range(threads)))
    window = time.perf_counter() - started
    return {"offered": int(rate * seconds), "done": len(latencies), "failed": sum(failures.values()),
            "failures": failures, "window_seconds": round(window, 1),
            "opens_per_second": round(len(latencies) / window, 1),
            "open_p50_ms": ms(latencies, 0.5), "open_p99_ms": ms(latencies, 0.99),
            "close_p50_ms": ms(closes, 0.5), "close_p99_ms": ms(closes, 0.99), "late_p99_ms": ms(late, 0.99)}


class Usage:
    """CPU (percent of one core) and RSS of a set of processes, over a window."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        self._procs = procs

    def begin(self) -> None:
        for proc in self._procs:
            proc.cpu_percent(None)

    def end(self) -> tuple[float, float]:
        """(CPU percent since begin, RSS MiB now), summed."""
        return (round(sum(p.cpu_percent(None) for p in self._procs), 1),
                round(sum(p.memory_info().rss for p in self._procs) / 2**20, 1))


def read_profile(path: Optional[Path]) -> Optional[dict]:
    if path is None:
        return None
    time.sleep(1.2)  # the sampler writes its counts once a second
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    return None


def profile_window(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """Where the tracker's request threads spent a window (tracker_profile.py): shares of samples."""
    if not before or not after:
        return None
    samples = after["samples"] - before["samples"]

    def diff(kind: str) -> dict:
        return {k: v - before[kind].get(k, 0) for k, v in after[kind].items() if v - before[kind].get(k, 0) > 0}

    threads, lock, functions = diff("request_threads"), diff("registry_lock"), diff("functions")
    thread_total = max(1, sum(threads.values()))
    cpu = {k: round(v - before["thread_cpu_s"].get(k, 0.0), 2) for k, v in after["thread_cpu_s"].items()}
    return {"samples": samples, "window_s": round(after["at"] - before["at"], 1),
            "request_thread_share": {k: round(v / thread_total, 3) for k, v in sorted(threads.items())},
            "busy_request_threads": round(thread_total / max(1, samples), 2),
            "registry_lock_share": {k: round(v / max(1, samples), 3) for k, v in sorted(lock.items())},
            "thread_cpu_s": cpu, "process_cpu_s": round(after["process_cpu_s"] - before["process_cpu_s"], 2),
            "top_functions": dict(sorted(functions.items(), key=lambda kv: -kv[1])[:10])}


@contextlib.contextmanager
def backend_flags(backend: str, tmp: Path):
    """(extra tracker flags, the backend's own processes) for `backend`, torn down on exit."""
    if backend == "embedded":
        yield [], []
        return
    with EtcdCluster(3, base_dir=tmp) as cluster:
        members = [p for p in psutil.Process().children() if str(cluster.dir) in " ".join(p.cmdline())]
        yield ["--etcd", ",".join(cluster.endpoints), "--etcd-prefix", "/meshnet/load/"], members


def measure(backend: str, nodes_count: int, rates: list[float], args: argparse.Namespace) -> dict:
    out = {"backend": backend, "nodes": nodes_count, "rates": []}
    with tempfile.TemporaryDirectory(prefix="meshnet-load-") as tmp, \
            backend_flags(backend, Path(tmp)) as (flags, members):
        profile = Path(tmp) / "profile.json" if args.profile else None
        prefix = [sys.executable, "-m", "meshnet.bench.tracker_profile", "--out", str(profile), "--"] if profile else []
        tracker = TrackerProcess(Path(tmp), [MODEL], lease_seconds=args.heartbeat_seconds * 3, prefix=prefix,
                                 extra_args=flags).start()
        usage = {"tracker": Usage([psutil.Process(tracker.proc.pid)]), "generator": Usage([psutil.Process()]),
                 "etcd": Usage(members)}
        nodes = Nodes(tracker, nodes_count, args.heartbeat_seconds, args.heartbeat_threads)
        try:
            nodes.start()
            register_s, registered = nodes.register(args.register_limit_seconds)
            out.update(register_seconds=round(register_s, 2), registered=registered,
                       registrations_per_second=round(registered / register_s, 1),
                       register_refused=nodes.register_refused)
            if registered < nodes_count:
                out["not_measured"] = (f"registered {registered} of {nodes_count} nodes in {register_s:.0f} s "
                                       f"(limit {args.register_limit_seconds:g} s); route rates not run")
                log("load_not_measured", backend=backend, nodes=nodes_count, reason=out["not_measured"])
                return out
            time.sleep(min(5.0, args.heartbeat_seconds))
            for rate in rates:
                out["rates"].append(measure_rate(tracker, nodes, rate, args, usage, profile))
                log("load_cell", backend=backend, nodes=nodes_count, **out["rates"][-1])
            out["knee_route_rate"] = next((c["route_rate"] for c in out["rates"] if c["open_p99_ms"] > args.knee_ms
                                           or c["opens_per_second"] < 0.9 * c["route_rate"]), None)
            return out
        finally:
            out["heartbeat_errors"], out["leases_lapsed"] = nodes.beat_errors, nodes.lapsed
            nodes.stop()
            tracker.stop()


def measure_rate(tracker: TrackerProcess, nodes: Nodes, rate: float, args: argparse.Namespace,
                 usage: dict[str, Usage], profile: Optional[Path]) -> dict:
    before = read_profile(profile)
    for u in usage.values():
        u.begin()
    first_beat = len(nodes.beats)
    started = time.perf_counter()
    cell = open_routes(tracker, rate, args.seconds, args.route_threads)
    elapsed = time.perf_counter() - started
    beats = nodes.beats[first_beat:]
    (tracker_cpu, tracker_rss), (generator_cpu, _), (etcd_cpu, etcd_rss) = (
        usage[k].end() for k in ("tracker", "generator", "etcd"))
    cell.update(route_rate=rate, heartbeats_per_second=round(len(beats) / elapsed, 1),
                heartbeat_offered_per_second=round(nodes.offered_per_second, 1),
                heartbeat_p50_ms=ms([b for _, b in beats], 0.5), heartbeat_p99_ms=ms([b for _, b in beats], 0.99),
                tracker_cpu_percent=tracker_cpu, tracker_rss_mib=tracker_rss, etcd_cpu_percent=etcd_cpu,
                etcd_rss_mib=etcd_rss, generator_cpu_percent=generator_cpu, leases_lapsed_so_far=nodes.lapsed)
    window = profile_window(before, read_profile(profile))
    if window is not None:
        cell["profile"] = window
    return cell


def print_table(results: dict) -> None:
    for backend in results["backends"]:
        print(f"\n{backend}: {BACKENDS[backend]}")
        print(f"{'nodes':>6} {'rate/s':>6} {'done':>5} {'open p50':>9} {'open p99':>9} {'hb/s':>7} {'hb p99':>7} "
              f"{'cpu %':>6} {'rss MiB':>8} {'etcd cpu':>8} {'etcd MiB':>8}")
        for run in (r for r in results["runs"] if r["backend"] == backend):
            for c in run["rates"]:
                print(f"{run['nodes']:>6} {c['route_rate']:>6g} {c['done']:>5} {c['open_p50_ms']:>9} "
                      f"{c['open_p99_ms']:>9} {c['heartbeats_per_second']:>7} {c['heartbeat_p99_ms']:>7} "
                      f"{c['tracker_cpu_percent']:>6} {c['tracker_rss_mib']:>8} {c['etcd_cpu_percent']:>8} "
                      f"{c['etcd_rss_mib']:>8}")
            if "not_measured" in run:
                print(f"{run['nodes']:>6} not measured: {run['not_measured']}")
            else:
                print(f"{run['nodes']:>6} knee at {run['knee_route_rate']} routes/s; registered in "
                      f"{run['register_seconds']} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--backend", choices=("embedded", "etcd", "both"), default="embedded")
    parser.add_argument("--nodes", default="100,1000,10000")
    parser.add_argument("--route-rates", default="10,50,100,200")
    parser.add_argument("--seconds", type=float, default=10.0, help="per route rate")
    parser.add_argument("--heartbeat-seconds", type=float, default=20.0,
                        help="each node's heartbeat period (the lease is 3 times it)")
    parser.add_argument("--knee-ms", type=float, default=50.0, help="OpenRoute p99 that marks the knee")
    parser.add_argument("--route-threads", type=int, default=16, help="client threads opening routes")
    parser.add_argument("--heartbeat-threads", type=int, default=16, help="threads sending the nodes' heartbeats")
    parser.add_argument("--register-limit-seconds", type=float, default=600.0,
                        help="give up registering a node count after this long (recorded, not skipped)")
    parser.add_argument("--profile", action="store_true",
                        help="sample the tracker's threads (tracker_profile.py); adds a profile to each cell")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the tracker and etcd are stopped
    args.out.mkdir(parents=True, exist_ok=True)
    backends = ["embedded", "etcd"] if args.backend == "both" else [args.backend]
    results = {"backends": {b: BACKENDS[b] for b in backends}, "host": {
        "cores": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)},
        "heartbeat_seconds": args.heartbeat_seconds, "seconds_per_rate": args.seconds, "knee_ms": args.knee_ms,
        "profiled": args.profile, "runs": []}
    for backend in backends:
        for count in (int(n) for n in args.nodes.split(",")):
            results["runs"].append(measure(backend, count, [float(r) for r in args.route_rates.split(",")], args))
            (args.out / "scale.json").write_text(json.dumps(results, indent=1) + "\n")
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
