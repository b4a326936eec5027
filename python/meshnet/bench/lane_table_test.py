"""The lane table's invariants: unique names, a label and a runner for every lane, the derived
lists consistent with it, and every lane docs/performance-contract.json names is one the bench
reports (or one tools/gpu_check/gpu_check.py reports)."""

import json
import os
from pathlib import Path

import pytest

from meshnet.bench import harness, lane_table
from meshnet.bench.lane_table import BY_NAME, DEFAULT_LANES, LANES, RUNTIME_ONLY, SPECULATION_PAIRS, TABLE

GPU_CHECK_LANES = {"gpu_single_process", "gpu_ring_3_nodes"}  # tools/gpu_check/gpu_check.py's contract figures


def test_names_are_unique_and_lane_shaped():
    names = [spec.name for spec in TABLE]
    assert len(names) == len(set(names)) == len(LANES) == len(BY_NAME)
    assert all(name and name == name.strip() and "," not in name for name in names)  # --lanes is comma-separated


def test_every_lane_has_a_label_and_a_runner():
    for spec in TABLE:
        assert callable(spec.run), spec.name
        label = spec.label.format(k=3)  # `{k}` is the only field a label may have
        assert label.strip() and "{" not in label and "}" not in label, spec.name


def test_derived_lists_follow_the_table():
    assert LANES == tuple(spec.name for spec in TABLE)
    assert set(DEFAULT_LANES) <= set(LANES) and set(RUNTIME_ONLY) <= set(DEFAULT_LANES)
    assert [n for n in LANES if n in DEFAULT_LANES] == list(DEFAULT_LANES)  # same order
    for spec, plain in SPECULATION_PAIRS:
        assert spec in BY_NAME and plain in BY_NAME and spec != plain
    assert all(spec.group for spec in TABLE if not spec.default)  # the help text names what is off by default
    for role in (lane_table.REFERENCE_TOKENS, lane_table.BATCHED_BASELINE, lane_table.NAMESPACE_WAN):
        assert role in BY_NAME


def test_lanes_help_names_the_groups_off_by_default():
    assert lane_table.lanes_help() == "which lanes, run in this order (the Vulkan lanes only when named)"


def test_unknown_lane_is_refused_with_the_table(capsys):
    with pytest.raises(SystemExit):
        harness.parse_args(["--worker-binary=/x", "--batched-bench=/x", "--rpc-server=/x", "--quantize=/x",
                            "--dump-logits=/x", "--lanes", "gguf_ring_3_nodes,no_such_lane"])
    assert f"unknown lane 'no_such_lane'; lanes: {', '.join(LANES)}" in capsys.readouterr().err


def unreported(contract: dict, lanes: tuple[str, ...]) -> set[str]:
    """The lanes contract checks name that harness.contract_figures does not report when every
    one of `lanes` ran, less those tools/gpu_check/gpu_check.py measures."""
    named = {check[key] for check in contract["checks"] for key in ("lane", "baseline_lane") if key in check}
    cell = {"prompt_tokens": 128, "concurrency": 1, "decode_tok_s": 1.0}
    results = {"meta": {"prompts": [128]}, "lanes": {name: {"available": True, "cells": [cell]} for name in lanes},
               "drift": {"q4_1": {"top1_agreement": 1.0}}}
    return named - set(harness.contract_figures(results)["lanes"]) - GPU_CHECK_LANES


def test_every_contract_lane_is_in_the_table():
    contract = json.loads(Path(os.environ["MESHNET_CONTRACT"]).read_text())
    assert unreported(contract, LANES) == set()
    assert GPU_CHECK_LANES.isdisjoint(LANES)
    # and the check can fail: a table without a lane the contract names leaves it unreported
    assert unreported(contract, tuple(n for n in LANES if n != "gguf_ring_3_nodes_spec")) == {"gguf_ring_3_nodes_spec"}
