"""Each shard holds what its layer range owns: weights and KV follow the range.

//cpp/engine:measure_shard loads the whole model and each range in its own process (mmap off, so
RSS follows what is read) and reports the engine's weight and KV bytes and RSS. Checks per
shard: its weight bytes equal the GGUF's bytes of the tensors the range owns
(meshnet.recipe.fingerprint.owned_tensor_names, the same rule fingerprints use); the shards' KV
adds up to the whole model's exactly (per-layer caches, sliding-window layers included); what RSS
grows by at load beyond the weights (vocabulary, metadata, buffers) is the whole model's
overhead within 4 MiB, the bound the Llama engine test uses.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Sequence

from meshnet.recipe.fingerprint import gguf_summary, owned_tensor_names
from meshnet.recipe.gguf_header import read_header

MIB = 1 << 20
OVERHEAD_SLACK = 4 * MIB


def measure(tool: Path, gguf: Path, start: int, end: int) -> dict:
    proc = subprocess.run([str(tool), str(gguf), str(start), str(end)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"measure_shard [{start}, {end}) exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shard_memory(tool: Path, gguf: Path, cuts: Sequence[tuple[int, int]]) -> dict:
    summary = gguf_summary(gguf)
    sizes = {t.name: t.n_bytes for t in read_header(gguf).tensors}
    whole = measure(tool, gguf, 0, -1)
    whole_over = whole["rss_load"] - whole["rss_base"] - whole["weights"]
    shards, kv_sum = [], 0
    for start, end in cuts:
        x = measure(tool, gguf, start, end)
        owned = sum(sizes[n] for n in owned_tensor_names(summary, sizes, start, end, gguf))
        over = x["rss_load"] - x["rss_base"] - x["weights"]
        shards.append({"range": [start, end], "weights_mib": round(x["weights"] / MIB, 2),
                       "owned_tensors_mib": round(owned / MIB, 2), "kv_mib": round(x["kv"] / MIB, 3),
                       "rss_load_mib": round((x["rss_load"] - x["rss_base"]) / MIB, 1),
                       "overhead_mib": round(over / MIB, 1), "weights_equal_owned": x["weights"] == owned,
                       "overhead_within_slack": abs(over - whole_over) <= OVERHEAD_SLACK})
        kv_sum += x["kv"]
    return {"whole": {"weights_mib": round(whole["weights"] / MIB, 2), "kv_mib": round(whole["kv"] / MIB, 3),
                      "rss_load_mib": round((whole["rss_load"] - whole["rss_base"]) / MIB, 1),
                      "overhead_mib": round(whole_over / MIB, 1)},
            "shards": shards, "kv_sum_equals_whole": kv_sum == whole["kv"],
            "proportional": kv_sum == whole["kv"] and all(s["weights_equal_owned"] and s["overhead_within_slack"]
                                                          for s in shards)}
