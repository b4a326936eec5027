"""The calibration pipeline on 4 short sequences (2 set the tolerance, 2 are scored): cheats
that change a hop's output beyond honest divergence are refuted at most positions."""

from __future__ import annotations

import json
import os

from meshnet.verify import calibrate


def test_the_calibration_refutes_garbage_a_skipped_layer_and_forged_tokens(tmp_path):
    assert calibrate.main(["--gguf", os.environ["MESHNET_BUNDLED_GGUF"],
                           "--dump-boundaries", os.environ["MESHNET_DUMP_BOUNDARIES"],
                           "--greedy", os.environ["MESHNET_GREEDY_BINARY"],
                           "--quantize", os.environ["MESHNET_QUANTIZE"],
                           "--out", str(tmp_path), "--prompts", "4", "--continuation", "24"]) == 0
    report = json.loads((tmp_path / "calibration.json").read_text())
    tol = report["tolerance"]
    assert 0 < tol["max_value_error"] < 1 and tol["min_overlap"] >= 1 and tol["max_logit_gap"] >= 0
    cheats = report["cheats"]
    assert cheats["garbage"]["detection_per_position"] == 1.0
    assert cheats["forged_tokens"]["detection_per_position"] >= 0.95  # a random token may be the argmax
    assert cheats["skip_layer"]["detection_per_position"] >= 0.5
    assert cheats["skip_layer"]["per_session"]["p_session"] >= 0.9
    # the hop before the cheat is never refuted: it is honest, and its output is untouched
    assert cheats["garbage"]["hop0"]["refuted"] == 0 and cheats["skip_layer"]["hop0"]["refuted"] == 0
