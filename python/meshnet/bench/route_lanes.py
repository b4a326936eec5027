"""Lanes 4 to 6 (and the WAN lane): real swarms driven through RouteClient.

A lane starts a tracker and one node per layer range (LocalSwarm), warms the route up, then
runs every (prompt, concurrency) cell: `c` client threads start together, each opens its own
route session and records the time of every token. Around each cell the harness reads every
shard's Health (batches, rows, compute time, SeamFrames in) and samples it every 100 ms while
the cell runs (queue depth, live sessions, KV cells). Peak RSS of each node's processes (the
Python node and, for GGUF, its worker) is read from /proc before the swarm stops.

RouteOptions say how the lane drives the route: TLS or plaintext links, ring decode or the
client driving each token, and WAN links: with `delay_ms` every node registers the address of a
DelayProxy in front of it (bench/delay_proxy.py), so every link into a node (client to first
hop, hop to hop, the ring back to the first hop, the Results stream) carries that one-way delay
and rate. The harness's own Health probes dial the nodes directly. In single-stream cells the
probe also reads the hops' compute time when the first token arrives, so the decode compute per
token is known apart from prefill, and with it the latency model: hops' compute + N x delay.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import grpc
import psutil

from meshnet.bench.beside import Beside, BesideSessions
from meshnet.bench.delay_proxy import DelayProxy
from meshnet.bench.measure import cell_figures, rounded
from meshnet.memory_cap import peak_rss_bytes
from meshnet.bench.schema import Cell
from meshnet.client.session import GenerationParams, RouteClient
from meshnet.protocol.shard_client import ShardClient
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.swarm.local import LocalSwarm
from meshnet.wire.seam import Health, StepTimes

Progress = Callable[[str], None]
BESIDE_SETTLE_S = 5.0  # seconds a lane's hostile sessions run before its cells start


@dataclasses.dataclass(frozen=True)
class RouteOptions:
    insecure: bool = False  # plaintext links (route tickets still checked)
    ring: bool = False  # ring decode; False: the client sends each decode step (the v1 lanes)
    delay_ms: Optional[float] = None  # one-way delay of every link into a node (a DelayProxy)
    rate_mbit: Optional[float] = None  # and its rate (None: unlimited)
    speculate: int = 0  # ring decode: the most tokens the first hop drafts per step (0: off)
    commitments: bool = True  # workers keep commitments for audits (ADR 0008); False: none (no audits possible)
    audit_rate: Optional[float] = None  # the tracker's audit draw (None: its default)
    reference_kernels: bool = True  # False: upstream's CPU kernels, F16 flash attention (ADR 0009, 0010)
    matmul_activations: Optional[str] = None  # the recipe's (ADR 0012); None: the backend's default
    device: str = "cpu"  # where every node computes (ADR 0014): vulkan0 needs a worker linked with Vulkan
    grammar: str = ""  # constrained sampling on the last hop (issue 33): GBNF every token continues
    # The verifier role running during the lane on this machine: (dump_boundaries binary, calibration.json).
    verifier: Optional[tuple[Path, Path]] = None
    # A hostile client's sessions running beside the measured streams, on the same hops (issue 55).
    beside: Optional[Beside] = None


class HealthProbe:
    """Health of every shard in a swarm: snapshots, plus maxima sampled in the background. The
    channels are the swarm's (LocalSwarm.shard_channels); the swarm closes them."""

    def __init__(self, channels: Sequence[grpc.Channel]) -> None:
        self._channels = list(channels)
        self._shards = [ShardClient(c) for c in self._channels]
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.max_queue = 0
        self.max_sessions = 0
        self.max_kv_cells = 0

    def snapshot(self) -> list[Health]:
        return [shard.health(timeout=5) for shard in self._shards]

    def start_sampling(self) -> None:
        self.max_queue = self.max_sessions = self.max_kv_cells = 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop_sampling(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            try:
                replies = self.snapshot()
            except grpc.RpcError:
                continue
            self.max_queue = max(self.max_queue, max(r.queue_depth for r in replies))
            self.max_sessions = max(self.max_sessions, max(r.active_sessions for r in replies))
            self.max_kv_cells = max(self.max_kv_cells, max(r.kv_cells_used for r in replies))

def _stream(tracker: TrackerClient, ids: list[int], tokens: int, go: threading.Event, times: list[float],
            out: list[int], errors: list[str], options: RouteOptions,
            on_first: Optional[Callable[[], None]] = None) -> None:
    session = RouteClient(tracker, "bench-model", client_id="bench", insecure=options.insecure)
    go.wait()
    try:
        for token in session.generate(ids, GenerationParams(max_tokens=tokens, ring=options.ring,
                                                            speculate=options.speculate, grammar=options.grammar)):
            times.append(time.perf_counter())
            out.append(token)
            if on_first is not None and len(out) == 1:
                on_first()
    except Exception as e:  # noqa: BLE001 - a failed stream is a measured failure, not a crash
        errors.append(f"{type(e).__name__}: {e}")


def run_cell(tracker: TrackerClient, probe: HealthProbe, prompts: Sequence[list[int]], tokens: int,
             options: RouteOptions = RouteOptions(), hops: int = 1) -> tuple[Cell, list[list[int]]]:
    c = len(prompts)
    times: list[list[float]] = [[] for _ in range(c)]
    outs: list[list[int]] = [[] for _ in range(c)]
    errors: list[str] = []
    go = threading.Event()
    at_first: list = []
    on_first = (lambda: at_first.append(probe.snapshot())) if c == 1 else None
    threads = [threading.Thread(target=_stream, args=(tracker, prompts[i], tokens, go, times[i], outs[i], errors,
                                                          options, on_first))
               for i in range(c)]
    for th in threads:
        th.start()
    before = probe.snapshot()
    probe.start_sampling()
    t0 = time.perf_counter()
    go.set()
    for th in threads:
        th.join()
    probe.stop_sampling()
    after = probe.snapshot()
    figures = cell_figures(t0, times, len(prompts[0]))
    batches = sum(a.batches - b.batches for a, b in zip(after, before))
    rows = sum(a.mean_batch_rows * a.batches - b.mean_batch_rows * b.batches for a, b in zip(after, before))
    seam_bytes = sum(a.seam_bytes_in - b.seam_bytes_in for a, b in zip(after, before))
    compute_s = sum(a.compute_us - b.compute_us for a, b in zip(after, before)) / 1e6
    positions = sum(len(p) for p in prompts) + sum(len(o) for o in outs)
    cell: Cell = {"prompt_tokens": len(prompts[0]), "concurrency": c, "new_tokens": tokens, **figures,
            "seam_bytes_per_token": seam_bytes / positions if positions else None,
            "mean_batch_rows": rows / batches if batches else None,
            "max_batch_sessions": max(a.max_batch_sessions for a in after) or None,
            "max_queue_depth": probe.max_queue, "max_live_sessions": probe.max_sessions,
            "max_kv_cells": probe.max_kv_cells, "failures": sum(1 for o in outs if len(o) < tokens),
            "drafted_tokens": sum(a.drafted_tokens - b.drafted_tokens for a, b in zip(after, before)),
            "accepted_drafts": sum(a.accepted_drafts - b.accepted_drafts for a, b in zip(after, before))}
    cell["hop_stages"] = hop_stages(before, after)
    if c == 1 and times[0] and compute_s > 0:
        # one stream: hops run one after another, so what is not compute is seams and client
        cell["seam_overhead_ms"] = max(0.0, (times[0][-1] - t0) - compute_s) / len(times[0]) * 1000
        cell["overhead_ms_per_token_per_hop"] = cell["seam_overhead_ms"] / hops
    if c == 1 and at_first and len(outs[0]) > 1:
        decode_us = sum(a.compute_us - f.compute_us for a, f in zip(after, at_first[0]))
        cell["decode_compute_ms_per_token"] = decode_us / 1000 / (len(outs[0]) - 1)
        if options.delay_ms is not None and cell.get("itl_p50_ms") is not None:
            cell["model_itl_ms"] = cell["decode_compute_ms_per_token"] + hops * options.delay_ms
            cell["itl_p50_over_model_ms"] = cell["itl_p50_ms"] - cell["model_itl_ms"]
            cell["itl_p95_over_model_ms"] = cell["itl_p95_ms"] - cell["model_itl_ms"]
    if errors:
        cell["errors"] = sorted(set(errors))[:5]
    return rounded(cell), outs


def hop_stages(before: Sequence[Health], after: Sequence[Health]) -> list[dict]:
    """Each hop's mean microseconds per completed decode step in each stage of its worker, between
    two Health snapshots (StepTimes, issue 31), with the wait split into queue, engine and the
    waiter's wake-up; None where the hop timed no step (a hop that reports no step times)."""
    out = []
    for b, a in zip(before, after):
        b_times, a_times = b.step_times or StepTimes(), a.step_times or StepTimes()
        steps = a_times.steps - b_times.steps
        stages: dict = {"steps": steps}
        for name in ("admit_us", "wait_us", "queue_us", "engine_us", "after_us", "send_us", "reply_us"):
            spent = getattr(a_times, name) - getattr(b_times, name)
            stages[name] = round(spent / steps, 1) if steps else None
        stages["wake_us"] = (round(stages["wait_us"] - stages["queue_us"] - stages["engine_us"], 1)
                             if steps else None)
        out.append(stages)
    return out


def node_memory(swarm: LocalSwarm) -> list[dict]:
    """Peak RSS of each node's processes: the Python node and its children (the GGUF worker)."""
    nodes = []
    for node_id, node in swarm.nodes.items():
        procs = [{"role": f"{node_id} node (python)", "peak_rss_bytes": peak_rss_bytes(node.proc.pid)}]
        for child in psutil.Process(node.proc.pid).children(recursive=True):
            procs.append({"role": f"{node_id} {Path(child.exe()).name}", "peak_rss_bytes": peak_rss_bytes(child.pid)})
        nodes.append({"node": node_id, "layers": list(node.layers), "processes": procs})
    return nodes


def run_lane(workdir: Path, gguf: Path, cuts: Sequence[tuple[int, int]], backend: str, worker: Optional[Path],
             prompts: dict[int, list[list[int]]], cells: Sequence[tuple[int, int]], tokens: int, threads: int,
             max_kv_tokens: int, progress: Progress, *, host: str = "127.0.0.1", node_hosts: Sequence[str] = (),
             node_prefixes: Sequence[Sequence[str]] = (), options: RouteOptions = RouteOptions()) -> dict:
    """Runs each (prompt length, concurrency) cell of `cells`, in order, on one swarm."""
    started = time.perf_counter()
    concurrency = [c for _, c in cells]
    proxies = [DelayProxy(options.delay_ms, options.rate_mbit) for _ in cuts] if options.delay_ms is not None else []
    try:
        with LocalSwarm(workdir, gguf, cuts, model="bench-model", backend=backend, worker_binary=worker,
                        threads=threads, max_sessions=max(max(concurrency), 8), max_kv_tokens=max_kv_tokens, host=host,
                        node_hosts=node_hosts, node_prefixes=node_prefixes, insecure=options.insecure,
                        node_advertise=[p.address for p in proxies],
                        node_args=([] if options.commitments else ["--no-commitments"]) +
                                  ([] if options.reference_kernels else ["--optimized-kernels"]),
                        audit_rate=options.audit_rate, matmul_activations=options.matmul_activations,
                        device=options.device) as swarm:
            for proxy, node in zip(proxies, swarm.nodes.values()):  # nodes in cut order
                proxy.target = (node.host, node.port)
            startup_s = time.perf_counter() - started
            with Verifying(swarm, gguf, options.verifier) as verifying:
                result = _measure(swarm, prompts, cells, tokens, progress, options, len(cuts), startup_s)
            if options.device != "cpu":
                result["devices"] = swarm.devices()
            if options.verifier is not None:
                result["audits"] = verifying.stats.summary()
            return result
    finally:
        for proxy in proxies:
            proxy.close()


class Verifying:
    """The verifier role (meshnet.verify.verifier) auditing the swarm's sampled sessions in a
    thread while a lane runs, on this machine's cores like everything else; nothing when
    `verifier` is None."""

    def __init__(self, swarm: LocalSwarm, gguf: Path, verifier: Optional[tuple[Path, Path]]) -> None:
        self._swarm, self._gguf, self._verifier = swarm, gguf, verifier
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.reported = 0
        self.stats: Optional[object] = None  # a VerifierStats once running

    def __enter__(self) -> "Verifying":
        if self._verifier is not None:
            from meshnet.verify import audit, commitment, verifier  # numpy and the replay tool: only here

            binary, calibration = self._verifier
            replayers = (audit.Replayer(binary, self._gguf, threads=1), audit.Replayer(binary, self._gguf, threads=2))
            tolerance = commitment.tolerance_from_calibration(calibration)
            client = self._swarm.tracker.client("verifier")
            self.stats = verifier.VerifierStats()

            def run() -> None:
                with client:
                    self.reported = verifier.serve_audits(client, replayers, tolerance, 16, self._stop, 0.5,
                                                          stats=self.stats)

            self._thread = threading.Thread(target=run, name="verifier", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)


def _measure(swarm: LocalSwarm, prompts: dict[int, list[list[int]]], grid: Sequence[tuple[int, int]], tokens: int,
             progress: Progress, options: RouteOptions, hops: int, startup_s: float) -> dict:
    with swarm.client() as tracker:
        channels = swarm.shard_channels(direct=True)
        probe = HealthProbe([channels[node_id] for node_id in swarm.nodes])
        run_cell(tracker, probe, [next(iter(prompts.values()))[0][:16]], 4, options, hops)  # warm-up
        beside = BesideSessions(tracker, options.beside, options.insecure) if options.beside else None
        if beside is not None:
            progress(f"{options.beside.sessions} sessions beside: {options.beside.label}")
            beside.start()
            time.sleep(BESIDE_SETTLE_S)  # its sessions opened and drawing before the cells start
        cells, tokens_c1 = [], {}
        try:
            for length, c in grid:
                progress(f"prompt {length}, concurrency {c}")
                cell, outs = run_cell(tracker, probe, prompts[length][:c], tokens, options, hops)
                cells.append(cell)
                if c == 1:
                    tokens_c1[length] = outs[0]
        finally:
            if beside is not None:
                beside.stop()
        health = probe.snapshot()
    nodes = node_memory(swarm)
    for node, reply in zip(nodes, health):
        node["kv_cells_total"] = reply.kv_cells_total
    result = {"cells": cells, "tokens": tokens_c1, "nodes": nodes, "startup_s": round(startup_s, 1)}
    if beside is not None:
        result["beside"] = beside.summary()
    return result
