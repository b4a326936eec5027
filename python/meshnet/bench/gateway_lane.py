"""The gateway lane: what the OpenAI-compatible gateway adds over the direct client, on one
swarm in one run.

One LocalSwarm of K GGUF nodes and one gateway process (meshnet.swarm.gateway). Solo streams
alternate between the direct client (RouteClient in this process) and the gateway (a streaming
/v1/completions request over HTTP with the same prompt token ids, greedy, read as SSE), so
machine noise falls on both alike; each stream records the arrival time of every token (for
the gateway, of every SSE event that carries text). Then `streams` gateway clients start
together and the lane counts the ones that failed.

Figures: ttft_ms and itl_p50_ms per side (medians over runs / pooled gaps), added_ttft_ms and
added_itl_p50_ms (gateway minus direct), errors_c32 and aggregate_tok_s_c32; and the CPU each
path spends per token over the solo runs: the gateway process (gateway_cpu_ms_per_token), the
bench process reading the gateway's SSE (gateway_client_cpu_ms_per_token), and the bench process
running the direct client (direct_client_cpu_ms_per_token). Those hold still where the ITL figures
move with the machine: on a 2-core machine every millisecond of it is taken from the workers.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from meshnet.bench.measure import cell_figures, percentile, rounded
from meshnet.bench.schema import Lane
from meshnet.process import cpu_seconds
from meshnet.client.session import GenerationParams, RouteClient
from meshnet.swarm.gateway import GatewayProcess
from meshnet.swarm.local import LocalSwarm

MODEL = "bench-model"


def _direct(swarm: LocalSwarm, ids: list[int], tokens: int) -> tuple[float, list[float]]:
    with swarm.client() as tracker:
        session = RouteClient(tracker, MODEL, client_id="bench-direct")
        t0 = time.perf_counter()
        times = []
        for _ in session.generate(ids, GenerationParams(max_tokens=tokens)):
            times.append(time.perf_counter())
    return t0, times


def _gateway(gateway: GatewayProcess, ids: list[int], tokens: int) -> tuple[float, list[float]]:
    """One streaming completion; the time of every SSE event that carries a token's text."""
    body = json.dumps({"model": MODEL, "prompt": ids, "max_tokens": tokens, "temperature": 0, "stream": True})
    conn = http.client.HTTPConnection(gateway.host, gateway.port, timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Authorization": f"Bearer {gateway.key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"gateway answered {response.status}: {response.read()[:300]!r}")
    times = []
    for line in response:  # http.client reads the chunked body as it arrives
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"stream failed: {event['error']}")
            if event["choices"] and event["choices"][0]["text"]:
                times.append(time.perf_counter())
    conn.close()
    return t0, times


def _side(runs: Sequence[tuple[float, list[float]]]) -> dict:
    gaps = [b - a for _, times in runs for a, b in zip(times, times[1:])]
    return {"ttft_ms": statistics.median((times[0] - t0) * 1000 for t0, times in runs if times),
            "itl_p50_ms": percentile(gaps, 50) * 1000 if gaps else None,
            "itl_p95_ms": percentile(gaps, 95) * 1000 if gaps else None, "runs": len(runs)}


def run_lane(workdir: Path, gguf: Path, cuts: Sequence[tuple[int, int]], worker: Path, prompts: list[list[int]],
             tokens: int, threads: int, progress: Callable[[str], None], *, repeats: int = 6,
             streams: int = 32) -> Lane:
    started = time.perf_counter()
    kv = streams * (max(len(p) for p in prompts) + tokens + 8)
    with LocalSwarm(workdir, gguf, cuts, model=MODEL, backend="gguf", worker_binary=worker, threads=threads,
                    max_sessions=streams, max_kv_tokens=kv) as swarm, GatewayProcess(swarm) as gateway:
        startup_s = time.perf_counter() - started
        _direct(swarm, prompts[0][:16], 4)  # warm-up, both paths
        _gateway(gateway, prompts[0][:16], 4)
        direct, via = [], []
        cpu = {"direct_client": 0.0, "gateway": 0.0, "gateway_client": 0.0}
        for r in range(repeats):
            progress(f"solo streams, round {r + 1}/{repeats} (direct, then gateway)")
            ids = prompts[r % len(prompts)]
            own = time.process_time()
            direct.append(_direct(swarm, ids, tokens))
            cpu["direct_client"] += time.process_time() - own
            own, served = time.process_time(), cpu_seconds(gateway.proc.pid)
            via.append(_gateway(gateway, ids, tokens))
            cpu["gateway_client"] += time.process_time() - own
            cpu["gateway"] += (cpu_seconds(gateway.proc.pid) or 0.0) - (served or 0.0)
        progress(f"{streams} concurrent gateway streams")
        times: list[list[float]] = [[] for _ in range(streams)]
        errors: list[str] = []
        go = threading.Event()

        def one(i: int) -> None:
            go.wait()
            try:
                _, times[i] = _gateway(gateway, prompts[i % len(prompts)], tokens)
            except Exception as e:  # noqa: BLE001 - a failed stream is the measured figure
                errors.append(f"{type(e).__name__}: {str(e)[:200]}")

        threads_ = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
        for th in threads_:
            th.start()
        t0 = time.perf_counter()
        go.set()
        for th in threads_:
            th.join()
        concurrent = cell_figures(t0, times, len(prompts[0]))
    d, g = _side(direct), _side(via)
    figures = {"added_ttft_ms": g["ttft_ms"] - d["ttft_ms"],
               "added_itl_p50_ms": g["itl_p50_ms"] - d["itl_p50_ms"] if g["itl_p50_ms"] and d["itl_p50_ms"] else None,
               "errors_c32": len(errors),
               "aggregate_tok_s_c32": concurrent.get("aggregate_tok_s")}
    direct_tokens, via_tokens = sum(len(times) for _, times in direct), sum(len(times) for _, times in via)
    for name, seconds in cpu.items():
        count = direct_tokens if name == "direct_client" else via_tokens
        figures[f"{name}_cpu_ms_per_token"] = seconds * 1000 / count if count else None
    return {"figures": rounded(figures, 3), "direct": rounded(d, 3), "gateway": rounded(g, 3),
            "concurrent": {"streams": streams, **rounded(concurrent, 3), "errors": sorted(set(errors))[:5]},
            "startup_s": round(startup_s, 1), "tokens": {},
            "notes": [f"{repeats} solo rounds alternating direct RouteClient and gateway SSE on one swarm of "
                      f"{len(cuts)} GGUF nodes; prompts of {len(prompts[0])} tokens, {tokens} new tokens, greedy; "
                      f"then {streams} concurrent gateway streams"]}
