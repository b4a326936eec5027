"""Lanes merged from interleaved rounds: medians, sums, maxima, unavailable rounds."""

from meshnet.bench import schema
from meshnet.bench.rounds import merge_rounds


def _route_round(decode: float, aggregate: float, failures: int, peak: int, engine_us: float) -> dict:
    return {
        "available": True, "label": "ring", "duration_s": 10.0, "notes": ["ring decode"],
        "cells": [
            {"prompt_tokens": 128, "concurrency": 1, "new_tokens": 64, "decode_tok_s": decode, "failures": 0,
             "max_queue_depth": 1, "hop_stages": [{"steps": 63, "engine_us": engine_us, "queue_us": None}]},
            {"prompt_tokens": 128, "concurrency": 8, "new_tokens": 64, "aggregate_tok_s": aggregate,
             "failures": failures, "errors": ["UNAVAILABLE"] * failures, "max_queue_depth": 8},
        ],
        "nodes": [{"node": "n0", "layers": [0, 30], "peak_rss_bytes": peak}],
        "peak_rss_bytes": peak, "tokens": {128: [1, 2, 3]},
    }


def test_each_figure_is_the_median_of_the_rounds_and_drift_in_one_round_drops_out():
    lane = merge_rounds([_route_round(40.0, 60.0, 0, 300, 900.0),
                         _route_round(26.0, 41.0, 0, 310, 1400.0),  # the machine was slow in this round
                         _route_round(42.0, 64.0, 0, 305, 880.0)])
    solo, eight = lane["cells"]
    assert (solo["prompt_tokens"], solo["concurrency"], solo["new_tokens"]) == (128, 1, 64)
    assert solo["decode_tok_s"] == 40.0
    assert eight["aggregate_tok_s"] == 60.0
    assert solo["hop_stages"] == [{"steps": 63, "engine_us": 900.0, "queue_us": None}]
    assert [c["decode_tok_s"] for c in (r[0] for r in lane["round_cells"])] == [40.0, 26.0, 42.0]
    assert lane["peak_rss_bytes"] == 310 and lane["nodes"][0]["peak_rss_bytes"] == 310
    assert lane["duration_s"] == 30.0
    assert lane["tokens"] == {128: [1, 2, 3]}
    assert lane["notes"][-1].startswith("figures: median of 3 interleaved rounds")


def test_failures_are_summed_and_high_water_marks_are_maxima():
    rounds = [_route_round(40.0, 60.0, 0, 300, 900.0), _route_round(40.0, 60.0, 2, 300, 900.0)]
    rounds[1]["cells"][1]["max_queue_depth"] = 9
    eight = merge_rounds(rounds)["cells"][1]
    assert eight["failures"] == 2
    assert eight["errors"] == ["UNAVAILABLE"]
    assert eight["max_queue_depth"] == 9


def test_an_integer_figure_stays_an_integer():
    rounds = [_route_round(40.0, 60.0, 0, 300, 900.0) for _ in range(3)]
    for r, steps in zip(rounds, (61, 63, 62)):
        r["cells"][0]["hop_stages"][0]["steps"] = steps
    steps = merge_rounds(rounds)["cells"][0]["hop_stages"][0]["steps"]
    assert steps == 62 and isinstance(steps, int)
    # Two rounds (the bench's --rounds 2): 61 and 62 have no whole median; the lower one is taken.
    steps = merge_rounds(rounds[:1] + [rounds[2]])["cells"][0]["hop_stages"][0]["steps"]
    assert steps == 61 and isinstance(steps, int)
    assert merge_rounds(rounds[:2])["cells"][0]["decode_tok_s"] == 40.0  # floats: the median


def test_a_round_that_did_not_run_is_named_and_left_out():
    broken = {"available": False, "reason": "failed: RuntimeError: worker exited 1", "label": "ring",
              "duration_s": 3.0}
    lane = merge_rounds([_route_round(40.0, 60.0, 0, 300, 900.0), broken, _route_round(44.0, 64.0, 0, 300, 900.0)])
    assert lane["available"] is True
    assert lane["cells"][0]["decode_tok_s"] == 42.0
    assert "round 2 did not run: failed: RuntimeError: worker exited 1" in lane["notes"]
    assert len(lane["round_cells"]) == 2


def test_no_round_ran_leaves_the_lane_unavailable_with_the_first_reason():
    rounds = [{"available": False, "reason": "needs root", "label": "wan"} for _ in range(2)]
    assert merge_rounds(rounds) == rounds[0]


def test_one_round_is_the_lane_unchanged():
    only = _route_round(40.0, 60.0, 0, 300, 900.0)
    assert merge_rounds([only]) is only


def test_lane_figures_merge_and_the_result_fits_the_schema():
    rounds = []
    for added in (0.5, 0.9, 0.4):
        lane = _route_round(40.0, 60.0, 0, 300, 900.0)
        lane["figures"] = {"added_itl_p50_ms": added, "errors_c32": 1, "tokens_identical": 1}
        rounds.append(lane)
    rounds[2]["figures"]["tokens_identical"] = 0
    lane = merge_rounds(rounds)
    assert lane["figures"]["added_itl_p50_ms"] == 0.5
    assert lane["figures"]["tokens_identical"] == 0
    lane.pop("tokens")  # run_group takes tokens out before results are written
    assert schema.problems({"lanes": {"gguf_ring_1_node": lane}}) == []
