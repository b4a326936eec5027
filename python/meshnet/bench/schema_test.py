"""Results types: the committed final comparison conforms, and a field that is not declared, or
has another type, is reported with where it is."""

import json
import os

from meshnet.bench import schema


def test_the_committed_final_results_conform():
    results = json.loads(open(os.environ["MESHNET_FINAL_RESULTS"]).read())
    assert results["lanes"], "no lanes in the committed results"
    assert schema.problems(results) == []


def test_unknown_fields_and_wrong_types_are_named():
    results = {"lanes": {"a": {"available": True, "cells": [{"prompt_tokens": 128, "concurrency": 1,
                                                              "decode_tok_s": 30.5, "ttft_ms": None}],
                               "figures": {"tokens_identical": 1}, "processes": [{"role": "x",
                                                                                  "peak_rss_bytes": 10}]}},
               "runtime_only": {"lanes": {"b": {"available": False, "reason": "why"}}}}
    assert schema.problems(results) == []
    results["lanes"]["a"]["cells"][0]["decode_tok_s"] = "fast"
    results["lanes"]["a"]["cells"][0]["speed"] = 1
    results["lanes"]["a"]["figures"]["tokens_identical"] = True
    results["runtime_only"]["lanes"]["b"]["extra"] = []
    found = schema.problems(results)
    assert found == ["lanes.a.cells[0].decode_tok_s: 'fast' is not typing.Union[int, float, NoneType]",
                     "lanes.a.cells[0]: 'speed' is not a field of Cell",
                     "lanes.a.figures.tokens_identical: True is not <class 'int'>",
                     "runtime_only.lanes.b: 'extra' is not a field of Lane"], found
