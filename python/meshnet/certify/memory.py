"""Each shard holds what its layer range owns: weights and KV follow the range.

//cpp/engine:measure_shard loads the whole model and each range in its own process (mmap off, so
RSS follows what is read) and reports the engine's weight and KV bytes and RSS. Checks per
shard: its weight bytes equal the GGUF's bytes of the tensors the range owns
(meshnet.recipe.fingerprint.owned_tensor_names, the same rule fingerprints use); the shards' KV
adds up to the whole model's exactly (per-layer caches, sliding-window layers included); what RSS
grows by at load beyond the weights (vocabulary, metadata, buffers) is the whole model's
overhead within 4 MiB, the bound the Llama engine test uses. Where the whole model may not be
loaded (certification under --max-memory), the shards' overheads are compared with their median
instead and the KV sum is left unchecked (reported as null).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from meshnet.memory_cap import CappedRunner
from meshnet.recipe.fingerprint import gguf_summary, owned_tensor_names
from meshnet.recipe.gguf_header import read_header

MIB = 1 << 20
OVERHEAD_SLACK = 4 * MIB


def measure(tool: Path, gguf: Path, start: int, end: int, runner: Optional[CappedRunner] = None) -> dict:
    command = [str(tool), str(gguf), str(start), str(end)]
    if runner is not None:
        proc = runner.run(f"llama.cpp memory of layers {start}:{end}" if end >= 0 else "llama.cpp memory, whole model",
                          command, timeout=600, reads=[gguf])
    else:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"measure_shard [{start}, {end}) exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shard_memory(tool: Path, gguf: Path, cuts: Sequence[tuple[int, int]], whole: bool = True,
                 runner: Optional[CappedRunner] = None) -> dict:
    """`whole`: also load the whole model (the reference for KV and overhead); without it (the
    whole model may not fit one process), the shards' overheads must agree with each other within
    the slack, and the KV sum is not checked."""
    summary = gguf_summary(gguf)
    sizes = {t.name: t.n_bytes for t in read_header(gguf).tensors}
    measured = [measure(tool, gguf, start, end, runner) for start, end in cuts]
    overheads = [x["rss_load"] - x["rss_base"] - x["weights"] for x in measured]
    report: dict = {"whole": None, "kv_sum_equals_whole": None}
    if whole:
        w = measure(tool, gguf, 0, -1, runner)
        reference_over = w["rss_load"] - w["rss_base"] - w["weights"]
        report["whole"] = {"weights_mib": round(w["weights"] / MIB, 2), "kv_mib": round(w["kv"] / MIB, 3),
                           "rss_load_mib": round((w["rss_load"] - w["rss_base"]) / MIB, 1),
                           "overhead_mib": round(reference_over / MIB, 1)}
        report["kv_sum_equals_whole"] = sum(x["kv"] for x in measured) == w["kv"]
    else:
        reference_over = sorted(overheads)[len(overheads) // 2]  # the shards' median
    shards = []
    for (start, end), x, over in zip(cuts, measured, overheads):
        owned = sum(sizes[n] for n in owned_tensor_names(summary, sizes, start, end, gguf))
        shards.append({"range": [start, end], "weights_mib": round(x["weights"] / MIB, 2),
                       "owned_tensors_mib": round(owned / MIB, 2), "kv_mib": round(x["kv"] / MIB, 3),
                       "rss_load_mib": round((x["rss_load"] - x["rss_base"]) / MIB, 1),
                       "overhead_mib": round(over / MIB, 1), "weights_equal_owned": x["weights"] == owned,
                       "overhead_within_slack": abs(over - reference_over) <= OVERHEAD_SLACK})
    report["shards"] = shards
    report["proportional"] = report["kv_sum_equals_whole"] is not False and all(
        s["weights_equal_owned"] and s["overhead_within_slack"] for s in shards)
    return report
