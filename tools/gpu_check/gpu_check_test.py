"""gpu_check's contract figures: lavapipe results never become GPU lanes, and a real GPU's
results are what docs/performance-contract.json's gpu_* checks read and judge."""

from __future__ import annotations

import json
import os
from pathlib import Path

from meshnet.bench import contract

import gpu_check


def device_result(description: str, single_tok_s: float, route_tok_s: float, overhead_ms: float) -> dict:
    health = {"node-0": {"device": "vulkan0", "device_description": description, "device_memory_used": 1,
                         "device_memory_free": 1, "device_memory_total": 2}}
    return {"device": "vulkan0", "run": True, "parity_ok": True, "ratio_3_nodes_over_single": route_tok_s / single_tok_s,
            "overhead_ms_per_token_per_hop": overhead_ms,
            "single": {"health": health, "decode_tok_s": single_tok_s},
            "route_3_nodes": {"health": health, "decode_tok_s": route_tok_s}}


def gpu_outcomes(figures: dict) -> dict:
    checks = json.loads(Path(os.environ["MESHNET_CONTRACT"]).read_text())
    return {o.check: o for o in contract.evaluate(checks, {"contract_figures": figures})
            if o.check.startswith("gpu_")}


def test_lavapipe_gives_no_gpu_lanes():
    lavapipe = device_result("llvmpipe (LLVM 15.0.6, 256 bits)", 2.0, 1.9, 1.0)
    assert gpu_check.software_device(lavapipe)
    figures = gpu_check.contract_figures([lavapipe])
    assert figures["lanes"] == {}
    outcomes = gpu_outcomes(figures)
    assert len(outcomes) == 2 and all(o.skipped for o in outcomes.values())


def test_a_real_gpu_is_judged_by_the_gpu_checks():
    slow_seam = device_result("NVIDIA H200", 400.0, 300.0, 0.9)
    assert not gpu_check.software_device(slow_seam)
    outcomes = gpu_outcomes(gpu_check.contract_figures([slow_seam]))
    assert not outcomes["gpu_ring_3_nodes_decode"].passed and outcomes["gpu_ring_3_nodes_decode"].measured == 0.75
    assert not outcomes["gpu_ring_overhead_per_token_per_hop"].passed
    fast_seam = device_result("NVIDIA H200", 400.0, 380.0, 0.1)
    outcomes = gpu_outcomes(gpu_check.contract_figures([fast_seam]))
    assert all(o.passed and not o.skipped for o in outcomes.values())


def test_a_device_that_did_not_run_is_passed_over():
    absent = {"device": "cuda0", "run": False, "why": "no binaries"}
    real = device_result("NVIDIA H200", 400.0, 380.0, 0.1)
    assert gpu_check.contract_figures([absent, real])["device"] == "vulkan0"
