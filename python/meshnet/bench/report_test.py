"""The report writer: summary.md sections (n/a, lanes not run, contract PASS/FAIL) and PNG plots."""

from __future__ import annotations

from pathlib import Path

from meshnet.bench import report
from meshnet.bench.contract import Outcome

PNG_SIGNATURE = b"\x89PNG"
MIB = 1 << 20


def _cell(prompt: int, concurrency: int, decode: float, **overrides) -> dict:
    cell = {"prompt_tokens": prompt, "concurrency": concurrency, "ttft_ms": 60.0 * prompt / 128,
            "prefill_tok_s": 2100.0, "decode_tok_s": decode, "aggregate_tok_s": decode * concurrency,
            "itl_p50_ms": 13.1, "itl_p95_ms": 15.0, "seam_bytes_per_token": None, "seam_overhead_ms": None,
            "mean_batch_rows": 1.0, "max_batch_sessions": 1, "max_queue_depth": 0, "failures": 0,
            "tokens_matching_transformers": 64, "new_tokens": 64}
    cell.update(overrides)
    return cell


def _grid(decode: float, **overrides) -> list[dict]:
    return [_cell(prompt, c, decode, **overrides) for prompt in (128, 512) for c in (1, 2, 4, 8)]


# A fake made up for this test: the figures are invented, not measured.
fake_results = {
    "meta": {"command": "bazel run //python:bench -- --fake", "started": "2026-11-29T11:30:00Z", "duration_s": 812.3,
             "host": {"cpu": "Fake CPU", "cores": 2, "memory_bytes": 25769803776, "kernel": "6.18", "python": "3.11.2"},
             "model": {"name": "smollm2", "path": "/fake/model.gguf", "type": "Q4_1", "bytes": 92000000},
             "threads": 2, "new_tokens": 64, "prompts": [128, 512], "concurrency": [1, 2, 4, 8], "k": 3,
             "node_budget": {"ratio": 1.5, "slack_mib": 10}},
    "lanes": {
        "llama_cpp_single_process": {
            "label": "llama.cpp single process", "available": True, "reason": None, "kind": "q4_1",
            "cells": _grid(75.0, ttft_ms=None),
            "processes": [{"role": "llama-server", "peak_rss_bytes": 300 * MIB}],
            "notes": ["fake baseline"],
        },
        "gguf_route_3_nodes": {
            "label": "GGUF route, 3 nodes", "available": True, "reason": None, "kind": "q4_1",
            "cells": _grid(60.0, seam_bytes_per_token=2400.0, seam_overhead_ms=1.2),
            "processes": [{"role": f"worker node-{i}", "peak_rss_bytes": 120 * MIB} for i in range(3)],
            "nodes": [{"node": f"node-{i}", "layers": [10 * i, 10 * i + 10], "peak_rss_bytes": 120 * MIB,
                       "weight_bytes": 30 * MIB, "kv_bytes": 8 * MIB} for i in range(3)],
            "notes": ["three fake workers"],
        },
        "llama_cpp_rpc_3": {
            "label": "llama.cpp RPC, 3 hosts", "available": False, "reason": "rpc-server binary not built (fake)",
            "cells": [],
        },
    },
    "drift": {"q4_1": {"top1_agreement": 1.0, "mean_kl": 0.0012, "max_kl": 0.026, "positions": 256}},
    "wan": {"applied": {"delay_ms": None, "rate_mbit": 100}, "notes": ["fake WAN note"]},
}

fake_outcomes = [
    Outcome("decode_vs_llama_cpp", True, 0.96, ">= 0.95", "fake pass"),
    Outcome("ttft_vs_llama_cpp", False, None, "<= 1.15", "fake fail: inputs missing"),
    Outcome("optional_model", False, None, ">= 0.9", "fake: lanes not run", contract_set="v2", skipped=True),
]


def test_summary_and_plots(tmp_path: Path):
    written = report.write_report(fake_results, tmp_path, fake_outcomes)
    summary = tmp_path / "summary.md"
    assert summary in written and summary.exists()
    text = summary.read_text()
    assert "rpc-server binary not built (fake)" in text
    assert "## Lanes not run" in text
    assert "n/a" in text
    assert "| decode_vs_llama_cpp (v1) | 0.960 | >= 0.95 | PASS |" in text
    assert "| ttft_vs_llama_cpp (v1) | n/a | <= 1.15 | FAIL |" in text
    assert "| optional_model (v2) | n/a | >= 0.9 | SKIP |" in text
    assert "1 passed, 1 failed, 1 skipped" in text
    assert "budget = 1.5 x (weights + KV) + 10 MiB, from the contract" in text  # the rule the bench read
    assert "64/64" in text
    pngs = [path for path in written if path.suffix == ".png"]
    assert {path.name for path in pngs} == {"aggregate_tok_s.png", "ttft.png", "itl.png", "rss.png"}
    for path in pngs:
        assert path.read_bytes().startswith(PNG_SIGNATURE)
        assert f"](plots/{path.name})" in text


def test_no_cells_writes_summary_and_no_plots(tmp_path: Path):
    # A fake made up for this test: lanes with no cells and no processes.
    empty = {"meta": {}, "lanes": {"a": {"label": "lane a", "available": True, "cells": []},
                                   "b": {"available": False, "reason": "not installed"}}}
    written = report.write_report(empty, tmp_path)
    assert written == [tmp_path / "summary.md"]
    assert "not installed" in (tmp_path / "summary.md").read_text()
    assert not list(tmp_path.glob("plots/*.png"))
