"""Cell figures from token times, batched-bench parsing, prompt making and layer cuts."""

import json
import os
import subprocess
import sys

from meshnet.bench import lanes, llama_lanes
from meshnet.bench.measure import cell_figures, percentile
from meshnet.memory_cap import RssWatch, peak_rss_bytes
from meshnet.swarm.local import even_cuts


def test_single_stream_figures():
    # start at 0, first token at 0.5 s, then one token every 0.1 s
    times = [0.5 + 0.1 * i for i in range(11)]
    f = cell_figures(0.0, [times], prompt_tokens=100)
    assert abs(f["ttft_ms"] - 500) < 1e-6
    assert abs(f["prefill_tok_s"] - 200) < 1e-6
    assert abs(f["decode_tok_s"] - 10) < 1e-6
    assert abs(f["aggregate_tok_s"] - 10) < 1e-6
    assert abs(f["itl_p50_ms"] - 100) < 1e-6 and abs(f["itl_p95_ms"] - 100) < 1e-6


def test_aggregate_counts_only_the_window_where_every_stream_decodes():
    # stream a decodes alone before b starts and after b ends; only the shared window counts
    a = [0.1 * i for i in range(1, 31)]  # 0.1 .. 3.0, 10 tok/s
    b = [1.0 + 0.05 * i for i in range(21)]  # 1.0 .. 2.0, 20 tok/s
    f = cell_figures(0.0, [a, b], prompt_tokens=10)
    # window (1.0, 2.0]: a gives 10 tokens, b gives 20
    assert abs(f["aggregate_tok_s"] - 30) < 1e-6
    assert abs(f["decode_tok_s"] - 15) < 1e-6  # median of 10 and 20


def test_empty_streams_give_no_figures():
    assert cell_figures(0.0, [[], []], 10) == {}


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 95) == 5
    assert percentile([], 50) is None


def test_batched_bench_jsonl():
    lines = [
        "llama_model_loader: noise",
        json.dumps({"pp": 128, "tg": 64, "pl": 1, "t_pp": 0.5, "speed_pp": 256.0, "t_tg": 0.8, "speed_tg": 80.0}),
        json.dumps({"pp": 128, "tg": 64, "pl": 8, "t_pp": 3.0, "speed_pp": 341.3, "t_tg": 2.0, "speed_tg": 256.0}),
    ]
    cells = llama_lanes.batched_bench_cells("\n".join(lines))
    assert [(c["prompt_tokens"], c["concurrency"]) for c in cells] == [(128, 1), (128, 8)]
    assert cells[0]["ttft_ms"] == 500 and cells[0]["decode_tok_s"] == 80
    assert cells[1]["aggregate_tok_s"] == 256 and cells[1]["decode_tok_s"] == 32


def test_peak_rss_of_a_child_is_its_own():
    ballast = bytearray(256 << 20)  # this (parent) process is big; the child must not inherit that figure
    ballast[::4096] = b"x" * len(ballast[::4096])
    proc = subprocess.Popen([sys.executable, "-c",
                             "import time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.5)"])
    watch = RssWatch(proc.pid, period=0.02)
    assert proc.wait() == 0
    rss = watch.result()
    assert 64 << 20 < rss < 200 << 20
    assert peak_rss_bytes(os.getpid()) > 0 and peak_rss_bytes(1 << 30) is None


def test_prompts_have_exact_lengths_and_differ():
    def fake_tokenizer(text):  # a fake for this test: one id per word
        return {"input_ids": [hash(w) % 1000 for w in text.split()]}

    prompts = lanes.make_prompts(fake_tokenizer, [20, 300], 4)
    assert [len(p) for p in prompts[300]] == [300] * 4
    assert len({tuple(p) for p in prompts[20]}) == 4


def test_cuts_cover_every_layer():
    assert even_cuts(30, 3) == [(0, 10), (10, 20), (20, 30)]
    assert even_cuts(30, 1) == [(0, 30)]
    parts = even_cuts(31, 4)
    assert parts[0][0] == 0 and parts[-1][1] == 31 and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


def test_grid_runs_long_prompts_at_one_stream_unless_all_cells():
    import argparse

    bench = lanes.Bench.__new__(lanes.Bench)
    bench.args = argparse.Namespace(all_cells=False)
    assert bench.grid([128, 512], [1, 8]) == [(128, 1), (128, 8), (512, 1)]
    bench.args.all_cells = True
    assert bench.grid([128, 512], [1, 8]) == [(128, 1), (128, 8), (512, 1), (512, 8)]


def test_batched_bench_runs_cover_the_grid_exactly():
    runs = llama_lanes.grid_commands([(128, 1), (128, 8), (512, 1), (1024, 1)])
    assert runs == [([128], [1, 8]), ([512, 1024], [1])]
    covered = sorted((p, c) for prompts, conc in runs for p in prompts for c in conc)
    assert covered == [(128, 1), (128, 8), (512, 1), (1024, 1)]
    assert llama_lanes.grid_commands([(128, 1), (128, 8), (512, 1), (512, 8)]) == [([128, 512], [1, 8])]
