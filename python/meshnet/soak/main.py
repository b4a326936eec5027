"""The chaos soak (issue 35): a live swarm under mixed load, injected faults and an attacker, for
a fixed time; then the checks a skeptic asks for.

  tools/bazel run //python:soak -- --minutes 30 --out docs/evidence/soak

The swarm: a tracker (with its relay and /metrics; the verifier role enrolled by key, and no key
enrolled), six GGUF nodes of the bundled SmolLM2 Q4_1 (two replicas of [0,10) [10,20) [20,30);
one of them behind NAT, reached through the tracker's relay) and the gateway. The load (soak/load.py) runs between --min-concurrency and
--max-concurrency requests at once (a new level each minute), through the gateway; the fault
scheduler (soak/faults.py) injects a fault every --fault-seconds on average; the attacker
(soak/attacks.py) runs one of issue 35's refusals every --attack-seconds. A refused client backs
off as the OpenAI SDKs do (exponentially from 0.5 s to 8 s, jittered; reset by a success). Every
process's RSS is sampled every 5 s and judged over its own lifetime (report.rss_growth). At the
end the load stops, every fault is undone, and each hop must hold 0 sessions and 0 KV cells
within 60 s. Written to --out: results.json (report.summarize), timeline.json, rss.json (every
sample: process -> [seconds since the start, MiB]), throughput.png, errors.png. Exit status 0
when every check passed, 1 otherwise.
Progress goes to stderr once a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import random
import tempfile
import threading
import time

import psutil

from meshnet.process import log
from meshnet.protocol.shard_client import ShardClient
from meshnet.recipe.certify import uncertified_entry
from meshnet.soak import attacks as attack_kinds
from meshnet.soak import report
from meshnet.soak.attacks import Attacker
from meshnet.soak.faults import Faults, worker_of
from meshnet.soak.load import Load
from meshnet.swarm.gateway import GatewayProcess
from meshnet.swarm.local import LocalSwarm, TrackerProcess

CUTS = [(0, 10), (10, 20), (20, 30)]
MODEL = "smollm2"
IDLE_DEADLINE_S = 60.0
IDLE_CPU_WINDOW_S = 5.0  # once every hop is idle, each process is watched this long
IDLE_CPU_MAX_S = 0.5  # and may use this much CPU in it (heartbeats, health probes)
UNROUTABLE_DEADLINE_S = 60.0  # for every node to be routable again after the end
BACKOFF_S = (0.5, 8.0)  # a refused client's first and longest wait (the OpenAI SDKs' defaults)


def build_swarm(workdir: pathlib.Path, gguf: pathlib.Path, worker: pathlib.Path) -> tuple[LocalSwarm, GatewayProcess]:
    tracker = TrackerProcess(workdir, [uncertified_entry(gguf, MODEL, "gguf", None, ["cpu"])], lease_seconds=3.0,
                             http=True, relay=True, ban_seconds=5.0, max_ban_seconds=30.0,
                             extra_args=["--enrolled-roles", "verifier"])  # no key enrolled: no verifier served
    swarm = LocalSwarm(workdir, gguf, CUTS, model=MODEL, backend="gguf", worker_binary=worker, max_sessions=16,
                       control_plane=tracker).start()
    for i, cut in enumerate(CUTS):
        nat = ["--behind-nat", "--relay-via", tracker.relay_address] if i == 1 else []
        swarm.add_node(f"node-{i + len(CUTS)}", cut, extra_args=nat)
    return swarm, GatewayProcess(swarm).start()  # one key, 64 generations at once


def hop_state(swarm: LocalSwarm) -> dict[str, tuple]:
    """(sessions, KV cells) per node of the swarm, by name; what a node that cannot answer said."""
    out = {}
    for node_id, channel in swarm.shard_channels(direct=True).items():
        name = next((n for n, i in swarm.ids.items() if i == node_id), node_id)
        try:
            h = ShardClient(channel).health(timeout=3)
            out[name] = (h.active_sessions, h.kv_cells_used)
        except Exception as err:  # reported as a leak: a hop that cannot say it is idle
            out[name] = ("unreachable", repr(err)[:100])
    return out


def processes(swarm: LocalSwarm, gateway: GatewayProcess) -> dict[str, int]:
    """Name -> pid of every process of the run (a restarted one is a new name)."""
    out = {f"tracker:{swarm.tracker.proc.pid}": swarm.tracker.proc.pid,
           f"gateway:{gateway.proc.pid}": gateway.proc.pid}
    for name, node_id in swarm.ids.items():
        node = swarm.nodes[node_id]
        if node.proc is not None and node.proc.poll() is None:
            out[f"{name}:{node.proc.pid}"] = node.proc.pid
            worker = worker_of(node)
            if worker is not None:
                out[f"{name}-worker:{worker.pid}"] = worker.pid
    return out


def busy_after(pids: dict[str, int]) -> dict[str, dict]:
    """The processes of `pids` that used more than IDLE_CPU_MAX_S of CPU in IDLE_CPU_WINDOW_S once
    the load stopped (issue 55: no thread left running a wedged draw or a stuck call), with their
    CPU seconds in the window and their threads."""
    procs = {}
    for name, pid in pids.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            procs[name] = (p, sum(p.cpu_times()[:2]))
    time.sleep(IDLE_CPU_WINDOW_S)
    busy = {}
    for name, (p, before) in procs.items():
        with contextlib.suppress(psutil.Error):
            spent = sum(p.cpu_times()[:2]) - before
            if spent > IDLE_CPU_MAX_S:
                busy[name] = {"cpu_s": round(spent, 2), "threads": p.num_threads()}
    return busy


class Soak:
    def __init__(self, args: argparse.Namespace, swarm: LocalSwarm, gateway: GatewayProcess) -> None:
        self.args, self.swarm, self.gateway = args, swarm, gateway
        self.rng = random.Random(args.seed)
        self.load = Load(gateway.base_url, gateway.key, MODEL)
        self.faults = Faults(swarm, random.Random(args.seed + 1))
        self.attacker = Attacker(gateway.base_url, gateway.key, MODEL, swarm.tracker, self.faults.under_fault)
        self.outcomes: list = []
        self.attacks: list = []
        self.rss: dict[str, list[tuple[float, int]]] = {}
        self.stop = threading.Event()
        self.concurrency = args.min_concurrency
        self._lock = threading.Lock()

    def _client(self, index: int) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        refused = 0  # in a row
        while not self.stop.is_set():
            if index >= self.concurrency:
                self.stop.wait(0.5)
                continue
            outcome = self.load.one(rng)
            with self._lock:
                self.outcomes.append(outcome)
            if outcome.status in ("ok", "200"):
                refused = 0
                continue
            wait = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** refused)
            refused += 1
            self.stop.wait(wait * rng.uniform(0.5, 1.0))

    def _faulter(self) -> None:
        while not self.stop.wait(self.rng.uniform(0.5, 1.5) * self.args.fault_seconds):
            self.faults.inject()

    def _attacking(self) -> None:
        kinds = attack_kinds.KINDS
        i = 0
        while not self.stop.wait(self.args.attack_seconds):
            result = self.attacker.run(kinds[i % len(kinds)])
            i += 1
            with self._lock:
                self.attacks.append(result)

    def _sampler(self, started: float) -> None:
        last_progress = started
        while not self.stop.wait(5.0):
            now = time.monotonic()
            for name, pid in processes(self.swarm, self.gateway).items():
                try:
                    self.rss.setdefault(name, []).append((now, psutil.Process(pid).memory_info().rss))
                except psutil.Error:
                    pass
            if now - last_progress >= 60:
                last_progress = now
                with self._lock:
                    served = sum(o.status == "ok" for o in self.outcomes)
                    wrong = sum(o.wrong for o in self.outcomes)
                    failed = len(self.outcomes) - served
                log("soak_progress", minutes=round((now - started) / 60, 1), concurrency=self.concurrency,
                    served=served, failed=failed, wrong=wrong, faults=len(self.faults.events),
                    attacks=len(self.attacks))

    def run(self) -> dict:
        self.load.record_solo()
        started = time.monotonic()
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                   for i in range(self.args.max_concurrency)]
        threads += [threading.Thread(target=t, daemon=True) for t in (self._faulter, self._attacking)]
        threads.append(threading.Thread(target=self._sampler, args=(started,), daemon=True))
        for thread in threads:
            thread.start()
        deadline = started + self.args.minutes * 60
        while time.monotonic() < deadline:
            time.sleep(min(60.0, max(0.0, deadline - time.monotonic())))
            self.concurrency = self.rng.randint(self.args.min_concurrency, self.args.max_concurrency)
        self.stop.set()
        for thread in threads:
            thread.join(timeout=240)
        ended = time.monotonic()
        self.faults.settle()
        leaks = self._leaks()
        idle = {"busy": busy_after(processes(self.swarm, self.gateway)), "unroutable": self._unroutable()}
        config = {k: v for k, v in vars(self.args).items() if k not in ("gguf", "worker_binary", "out")}
        summary = report.summarize(config, self.outcomes, self.faults.events, self.attacks, leaks,
                                   report.rss_growth(self.rss), started, ended, idle)
        rows = report.timeline(self.outcomes, started, ended)
        out = pathlib.Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "timeline.json").write_text(json.dumps(rows, indent=1) + "\n")
        (out / "rss.json").write_text(json.dumps(
            {name: [[round(t - started, 1), round(rss / 2**20, 1)] for t, rss in series]
             for name, series in self.rss.items()}) + "\n")
        (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
        report.plot(rows, self.faults.events, started, out)
        self.load.close()
        self.attacker.close()
        return summary

    def _unroutable(self) -> dict[str, str]:
        """Nodes quarantined, or not routable UNROUTABLE_DEADLINE_S after the end (a ban a fault earned
        has run out by then): no healthy node may be left out of routes."""
        deadline = time.monotonic() + UNROUTABLE_DEADLINE_S
        while True:
            out: dict[str, str] = {}
            try:
                with self.swarm.tracker.client(timeout=5.0) as tracker:
                    cover = tracker.coverage(MODEL)
                routable = {n for layer in cover.layers for n in layer.node_ids}
                for name, node_id in self.swarm.ids.items():
                    if node_id in cover.quarantined_node_ids:
                        out[name] = "quarantined"
                    elif node_id not in routable:
                        out[name] = "not routable"
            except Exception as err:  # the tracker not answering is reported, never passed
                out = {"tracker": f"{type(err).__name__}: {str(err)[:100]}"}
            if not out or time.monotonic() > deadline or "quarantined" in out.values():
                return out
            time.sleep(2.0)

    def _leaks(self) -> dict:
        """Hops not idle IDLE_DEADLINE_S after the load stopped (every node back up first)."""
        for node in self.swarm.nodes.values():
            if node.proc is None or node.proc.poll() is not None:
                node.launch().wait_ready(timeout=120)
        deadline = time.monotonic() + IDLE_DEADLINE_S
        while True:
            busy = {n: s for n, s in hop_state(self.swarm).items() if s != (0, 0)}
            if not busy or time.monotonic() > deadline:
                return busy
            time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=pathlib.Path, required=True)
    parser.add_argument("--worker-binary", type=pathlib.Path, required=True)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", type=pathlib.Path, required=True, help="where results.json and the plots go")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--min-concurrency", type=int, default=8)
    parser.add_argument("--max-concurrency", type=int, default=32)
    parser.add_argument("--fault-seconds", type=float, default=60.0, help="mean time between faults")
    parser.add_argument("--attack-seconds", type=float, default=5.0, help="time between attacks")
    args = parser.parse_args(argv)
    if not 1 <= args.min_concurrency <= args.max_concurrency:
        parser.error("need 1 <= --min-concurrency <= --max-concurrency")
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    args.out = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="meshnet-soak-") as tmp:
        swarm, gateway = build_swarm(pathlib.Path(tmp), args.gguf.resolve(), args.worker_binary.resolve())
        soak = None
        try:
            soak = Soak(args, swarm, gateway)
            summary = soak.run()
        finally:
            if soak is not None:
                soak.faults.close()
            gateway.stop()
            swarm.stop()
    print(json.dumps({k: summary[k] for k in ("seconds", "requests", "served", "wrong_tokens", "errors_by_code",
                                              "faults", "checks", "passed")}, indent=2))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
