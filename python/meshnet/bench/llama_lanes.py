"""Lanes 1 and 2: upstream llama.cpp's own tools, unpatched, from the pinned commit.

Lane 1 runs `llama-batched-bench` on the whole model in one process; lane 2 runs the same tool
with the model split over K local `ggml-rpc-server` processes (`--rpc`, every layer offloaded).
batched-bench prefills `pl` prompts of `pp` random tokens in one batch, then decodes `tg`
tokens for all of them in lockstep, and reports times for both phases. Its figures map onto a
cell as: TTFT = prefill time (every sequence's first token is due then), prefill tok/s = S_PP,
per-stream decode tok/s = tg / T_TG, aggregate = S_TG. It reports no per-token times, so these
lanes carry the mean inter-token latency only.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from meshnet.bench.delay_proxy import DelayProxy
from meshnet.memory_cap import RssWatch, peak_rss_bytes
from meshnet.bench.schema import Cell, Lane
from meshnet.process import free_port

Progress = Callable[[str], None]


def batched_bench_cells(output: str) -> list[Cell]:
    """Cells from batched-bench's `--output-format jsonl` lines (other lines are ignored)."""
    cells = []
    for line in output.splitlines():
        line = line.strip()
        if not (line.startswith("{") and '"speed_tg"' in line):
            continue
        row = json.loads(line)
        pp, tg, pl = int(row["pp"]), int(row["tg"]), int(row["pl"])
        cells.append({
            "prompt_tokens": pp, "concurrency": pl, "new_tokens": tg,
            "ttft_ms": row["t_pp"] * 1000, "prefill_tok_s": row["speed_pp"],
            "decode_tok_s": tg / row["t_tg"], "aggregate_tok_s": row["speed_tg"],
            "itl_mean_ms": row["t_tg"] / tg * 1000, "itl_p50_ms": None, "itl_p95_ms": None, "failures": 0,
        })
    return cells


def _command(binary: Path, gguf: Path, prompts: Sequence[int], concurrency: Sequence[int], tokens: int,
             threads: int, n_ctx: int, extra: Sequence[str] = ()) -> list[str]:
    return [str(binary), "-m", str(gguf), "-c", str(n_ctx), "-b", "2048", "-ub", "512",
            "-npp", ",".join(map(str, prompts)), "-ntg", str(tokens), "-npl", ",".join(map(str, concurrency)),
            "-t", str(threads), "-tb", str(threads), "--output-format", "jsonl", *extra]


def grid_commands(grid: Sequence[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
    """batched-bench runs every -npp with every -npl; the (prompts, concurrency) runs that cover
    `grid`'s (prompt, concurrency) cells exactly: one per distinct concurrency list, in order."""
    by_prompt: dict[int, list[int]] = {}
    for length, c in grid:
        by_prompt.setdefault(length, []).append(c)
    runs: dict[tuple[int, ...], list[int]] = {}
    for length, conc in by_prompt.items():
        runs.setdefault(tuple(conc), []).append(length)
    return [(prompts, list(conc)) for conc, prompts in runs.items()]


def _run(cmd: list[str], log: Path) -> tuple[str, int]:
    """Runs batched-bench; (stdout + stderr, its peak RSS). RuntimeError with the log tail on failure."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        watch = RssWatch(proc.pid)
        code = proc.wait()
        rss = watch.result()
    text = log.read_text()
    if code != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {code}:\n{text[-2000:]}")
    return text, rss


def single_process(binary: Path, gguf: Path, grid: Sequence[tuple[int, int]], tokens: int, threads: int,
                   n_ctx: int, workdir: Path, extra: Sequence[str] = ()) -> Lane:
    """batched-bench over `grid`; `extra`: more of its flags (e.g. --no-repack)."""
    cells, rss, commands = [], 0, []
    for i, (prompts, concurrency) in enumerate(grid_commands(grid)):
        cmd = _command(binary, gguf, prompts, concurrency, tokens, threads, n_ctx, extra)
        text, run_rss = _run(cmd, workdir / f"llama_cpp_single_process-{i}.log")
        cells += batched_bench_cells(text)
        rss, commands = max(rss, run_rss), commands + [" ".join(cmd[1:])]
    return {"cells": cells, "processes": [{"role": "llama-batched-bench", "peak_rss_bytes": rss}],
            "peak_rss_bytes": rss, "command": " ; ".join(commands)}


def rpc_split(binary: Path, rpc_server: Path, gguf: Path, servers: int, grid: Sequence[tuple[int, int]],
              tokens: int, threads: int, n_ctx: int, workdir: Path,
              delay_ms: Optional[float] = None, rate_mbit: Optional[float] = None) -> Lane:
    """With `delay_ms`, the client reaches each rpc-server through a DelayProxy (that one-way
    delay and `rate_mbit` on each link), as the GGUF route's WAN lanes reach each node."""
    ports = [free_port() for _ in range(servers)]
    logs = [open(workdir / f"rpc-server-{i}.log", "w") for i in range(servers)]
    procs = [subprocess.Popen([str(rpc_server), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)],
                              stdout=log, stderr=subprocess.STDOUT) for port, log in zip(ports, logs)]
    proxies = []
    try:
        _wait_listening(ports, procs)
        if delay_ms is not None:
            proxies = [DelayProxy(delay_ms, rate_mbit, target=("127.0.0.1", port)) for port in ports]
        dialed = [p.port for p in proxies] or ports
        cells, client_rss, commands = [], 0, []
        for i, (prompts, concurrency) in enumerate(grid_commands(grid)):
            cmd = _command(binary, gguf, prompts, concurrency, tokens, threads, n_ctx)
            cmd += ["--rpc", ",".join(f"127.0.0.1:{p}" for p in dialed), "-ngl", "99"]
            text, run_rss = _run(cmd, workdir / f"llama_cpp_rpc-{i}.log")
            cells += batched_bench_cells(text)
            client_rss, commands = max(client_rss, run_rss), commands + [" ".join(cmd[1:])]
        processes = [{"role": "llama-batched-bench (RPC client)", "peak_rss_bytes": client_rss}]
        for i, proc in enumerate(procs):
            processes.append({"role": f"ggml-rpc-server {i}", "peak_rss_bytes": peak_rss_bytes(proc.pid)})
    finally:
        for proxy in proxies:
            proxy.close()
        for proc in procs:
            proc.terminate()
            proc.wait()
        for log in logs:
            log.close()
    return {"cells": cells, "processes": processes,
            "peak_rss_bytes": sum(p["peak_rss_bytes"] or 0 for p in processes), "command": " ; ".join(commands)}


def _wait_listening(ports: Sequence[int], procs: Sequence[subprocess.Popen], timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    for port, proc in zip(ports, procs):
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ggml-rpc-server on port {port} exited {proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ggml-rpc-server on port {port} did not listen in {timeout} s") from None
                time.sleep(0.1)


def quantize_to_f32(quantize: Path, gguf: Path, out: Path, log: Optional[Path] = None) -> list[str]:
    """Writes the same weights, dequantized, as an F32 GGUF; returns the command it ran."""
    cmd = [str(quantize), "--allow-requantize", str(gguf), str(out), "F32"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-quantize exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return cmd
