"""`tools/bazel run //python:tracker_load -- --out DIR`: how much a tracker takes (issue 20).

A real tracker process (TLS, role tokens, signed requests, tickets: as deployed) and simulated
nodes: lightweight registrations with no model, each with its own Ed25519 identity, signing its
own Register and Heartbeat calls like a real node. For each node count (`--nodes`, default 100,
1,000, 10,000) the harness registers that many nodes (spread over 3 ranges of a 30-layer model),
keeps them heartbeating (each every `--heartbeat-seconds`, so the offered rate is nodes / that),
and then, for each route rate (`--route-rates`, route opens per second), opens and closes routes
at that rate for `--seconds` and records OpenRoute latency (p50, p99), the heartbeats answered
per second and their p99, the tracker's CPU (percent of one core) and RSS. The knee is the first
route rate whose OpenRoute p99 passes `--knee-ms` or that the tracker cannot keep up with (fewer
than 90% of the offered opens done). Results: DIR/scale.json and a table on stdout.

The load generator runs on the same machine as the tracker, so both share its cores; the
figures are this machine's, with the generator's own CPU reported beside the tracker's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import psutil

from meshnet.identity.keys import Identity
from meshnet.process import log
from meshnet.swarm.local import TrackerProcess
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, ProtocolVersion
from meshnet.wire.status import StatusCode

MODEL = {"model": "load-model", "architecture": "llama", "n_layer": 30, "artifact_fingerprint": "sha256:load",
         "recipe_fingerprint": "sha256:load-recipe"}
RANGES = [(0, 10), (10, 20), (20, 30)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def node_info(identity: Identity, i: int) -> tt.NodeInfo:
    start, end = RANGES[i % len(RANGES)]
    return tt.NodeInfo(identity.node_id, f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}:7000",
                       tt.BackendKind.GGUF, MODEL["model"], "llama", Fingerprints("sha256:load", "sha256:load-recipe"),
                       "", tt.LayerRange(start, end), tt.Capacity(16, 32768, 0, 2048), 30, identity.public_key, "")


class Nodes:
    """`count` simulated nodes heartbeating from a few client threads (one channel each)."""

    def __init__(self, tracker: TrackerProcess, count: int, heartbeat_seconds: float, threads: int = 4) -> None:
        self._tracker, self._period = tracker, heartbeat_seconds
        self.identities = [Identity.generate() for _ in range(count)]
        self._clients = [tracker.client("node", identity=None, timeout=30) for _ in range(threads)]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.beats: list[tuple[float, float]] = []  # (time answered, latency s)
        self.beat_errors = 0  # heartbeats that failed (RPC error)
        self.lapsed = 0  # heartbeats answered NOT_FOUND: the node's lease had lapsed

    def register(self) -> float:
        """Registers every node; the seconds it took."""
        started = time.perf_counter()

        def register_slice(k: int) -> None:
            client = self._clients[k]
            for i in range(k, len(self.identities), len(self._clients)):
                client.identity = self.identities[i]
                reply = client.register(tt.RegisterRequest(ProtocolVersion(1, 0), node_info(self.identities[i], i)))
                if not reply.status.ok:
                    raise RuntimeError(f"registration refused: {reply.status}")

        with ThreadPoolExecutor(len(self._clients)) as pool:
            list(pool.map(register_slice, range(len(self._clients))))
        return time.perf_counter() - started

    def start(self) -> None:
        for k in range(len(self._clients)):
            thread = threading.Thread(target=self._beat, args=(k,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _beat(self, k: int) -> None:
        client = self._clients[k]
        mine = self.identities[k::len(self._clients)]
        interval = self._period / max(1, len(mine))
        next_at = time.perf_counter()
        while not self._stop.is_set():
            for identity in mine:
                next_at += interval
                delay = next_at - time.perf_counter()
                if delay > 0 and self._stop.wait(delay):
                    return
                client.identity = identity
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


def open_routes(tracker: TrackerProcess, rate: float, seconds: float, threads: int = 4) -> dict:
    """Opens (and closes) routes at `rate` per second for `seconds`; OpenRoute latencies."""
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client_loop(k: int) -> None:
        nonlocal failures
        with tracker.client("client", timeout=30) as client:
            period = threads / rate
            next_at = time.perf_counter() + k * period / threads
            while next_at < deadline:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                next_at += period
                started = time.perf_counter()
                reply = client.open_route(tt.OpenRouteRequest(MODEL["model"], "load", 256))
                elapsed = time.perf_counter() - started
                with lock:
                    if reply.status.ok:
                        latencies.append(elapsed)
                    else:
                        failures += 1
                if reply.session is not None and reply.status.ok:
                    client.close_route(reply.session)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(client_loop, range(threads)))
    return {"offered": int(rate * seconds), "done": len(latencies), "failed": failures,
            "open_p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
            "open_p99_ms": round(percentile(latencies, 0.99) * 1000, 2)}


def measure(nodes_count: int, rates: list[float], seconds: float, heartbeat_seconds: float, knee_ms: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="meshnet-load-") as tmp:
        tracker = TrackerProcess(Path(tmp), [MODEL], lease_seconds=heartbeat_seconds * 3).start()
        proc = psutil.Process(tracker.proc.pid)
        here = psutil.Process()
        nodes = Nodes(tracker, nodes_count, heartbeat_seconds)
        try:
            register_s = nodes.register()
            nodes.start()
            time.sleep(min(5.0, heartbeat_seconds))
            out = {"nodes": nodes_count, "register_seconds": round(register_s, 2),
                   "registrations_per_second": round(nodes_count / register_s, 1), "rates": []}
            for rate in rates:
                proc.cpu_percent(None)
                here.cpu_percent(None)
                first_beat = len(nodes.beats)
                started = time.perf_counter()
                cell = open_routes(tracker, rate, seconds)
                elapsed = time.perf_counter() - started
                beats = nodes.beats[first_beat:]
                cell.update(route_rate=rate, heartbeats_per_second=round(len(beats) / elapsed, 1),
                            heartbeat_offered_per_second=round(nodes_count / heartbeat_seconds, 1),
                            heartbeat_p99_ms=round(percentile([b for _, b in beats], 0.99) * 1000, 2),
                            tracker_cpu_percent=round(proc.cpu_percent(None), 1),
                            generator_cpu_percent=round(here.cpu_percent(None), 1),
                            tracker_rss_mib=round(proc.memory_info().rss / 2**20, 1))
                cell["leases_lapsed_so_far"] = nodes.lapsed
                out["rates"].append(cell)
                log("load_cell", **cell, nodes=nodes_count)
            knee = next((c["route_rate"] for c in out["rates"]
                         if c["open_p99_ms"] > knee_ms or c["done"] < 0.9 * c["offered"]), None)
            out["knee_route_rate"] = knee
            out["heartbeat_errors"] = nodes.beat_errors
            return out
        finally:
            nodes.stop()
            tracker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--nodes", default="100,1000,10000")
    parser.add_argument("--route-rates", default="10,50,100,200")
    parser.add_argument("--seconds", type=float, default=10.0, help="per route rate")
    parser.add_argument("--heartbeat-seconds", type=float, default=20.0,
                        help="each node's heartbeat period (the lease is 3 times it)")
    parser.add_argument("--knee-ms", type=float, default=50.0, help="OpenRoute p99 that marks the knee")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"backend": "embedded (in-memory registry, SQLite ledger)", "host": {
        "cores": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)},
        "heartbeat_seconds": args.heartbeat_seconds, "seconds_per_rate": args.seconds, "knee_ms": args.knee_ms,
        "runs": []}
    for count in (int(n) for n in args.nodes.split(",")):
        results["runs"].append(measure(count, [float(r) for r in args.route_rates.split(",")], args.seconds,
                                       args.heartbeat_seconds, args.knee_ms))
        (args.out / "scale.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"{'nodes':>6} {'rate/s':>6} {'done':>5} {'open p50':>9} {'open p99':>9} {'hb/s':>7} {'hb p99':>7} "
          f"{'cpu %':>6} {'rss MiB':>8}")
    for run in results["runs"]:
        for c in run["rates"]:
            print(f"{run['nodes']:>6} {c['route_rate']:>6g} {c['done']:>5} {c['open_p50_ms']:>9} {c['open_p99_ms']:>9} "
                  f"{c['heartbeats_per_second']:>7} {c['heartbeat_p99_ms']:>7} {c['tracker_cpu_percent']:>6} "
                  f"{c['tracker_rss_mib']:>8}")
        print(f"{run['nodes']:>6} knee at {run['knee_route_rate']} routes/s; registered in {run['register_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
