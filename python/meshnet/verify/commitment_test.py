"""Commitments on synthetic rows: the replay's rounding noise passes, a changed row does not; a
tolerance that would judge nothing cannot be made or loaded (issue 55, finding 16)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meshnet.verify import commitment as cm

TOL = cm.Tolerance(max_value_error=0.02, min_overlap=7, max_logit_error=0.1, max_logit_gap=0.2)


def rows(seed: int = 0, n: int = 32, width: int = 576) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.normal(0, 1, (n, width)).astype(np.float32)
    out[:, rng.choice(width, 4, replace=False)] *= 40  # a few large outlier channels, as real residuals have
    return out


def test_a_commitment_keeps_the_largest_magnitudes_in_k_times_4_bytes():
    r = rows()
    c = cm.commit_hidden(r)
    assert c.indices.shape == (32, cm.K) and c.indices.dtype == np.uint16 and c.values.dtype == np.float16
    assert c.bytes_per_position == cm.K * 4
    for i in range(len(r)):
        assert set(c.indices[i]) == set(np.argsort(-np.abs(r[i]))[:cm.K])
        assert np.allclose(c.values[i], r[i][c.indices[i].astype(int)], rtol=1e-3)


def test_replay_noise_passes_and_a_changed_row_is_refuted():
    r = rows()
    c = cm.commit_hidden(r)
    rng = np.random.default_rng(1)
    replay = r * (1 + rng.normal(0, 1e-3, r.shape).astype(np.float32))  # honest rounding-sized drift
    assert cm.hidden_passes(c, replay, TOL).all()
    changed = replay.copy()
    changed[5] = rows(seed=2)[5]  # another row entirely
    changed[9] *= 1.1  # the same row, 10% off
    passes = cm.hidden_passes(c, changed, TOL)
    assert not passes[5] and not passes[9] and passes.sum() == len(r) - 2


def test_an_index_near_zero_in_the_replay_is_judged_against_the_row_scale():
    r = rows(n=1)
    c = cm.commit_hidden(r)
    replay = r.copy()
    err, overlap = cm.hidden_mismatch(c, replay)
    assert err[0] < 1e-3 and overlap[0] == cm.K
    replay[0, int(c.indices[0, 0])] = 0.0  # a committed outlier the replay does not have
    err, _ = cm.hidden_mismatch(c, replay)
    assert err[0] > 1.0  # refuted, not divided by ~0


def test_a_forged_token_is_refuted_and_an_honest_near_tie_is_not():
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 3, (16, 1000)).astype(np.float32)
    best = logits.argmax(axis=1)
    second = np.argsort(-logits, axis=1)[:, 1]
    logits[0, second[0]] = logits[0, best[0]] - 0.05  # a near-tie at position 0
    honest = cm.commit_tokens(best, logits)
    assert cm.tokens_pass(honest, logits, TOL).all()
    tie = cm.commit_tokens(np.where(np.arange(16) == 0, second, best), logits)
    assert cm.tokens_pass(tie, logits, TOL)[0]  # the replica picked the other of two near-equal tokens
    forged = cm.commit_tokens((best + 17) % 1000, logits)
    assert not cm.tokens_pass(forged, logits, TOL).any()


def test_a_sampled_token_is_judged_by_its_logit_and_a_greedy_one_by_its_rank_too():
    logits = np.zeros((1, 100), dtype=np.float32)
    logits[0, 7], logits[0, 3] = 5.0, 1.0
    sampled = cm.commit_tokens([3], logits)  # an honest draw 4 logits below the best
    assert cm.tokens_pass(sampled, logits, TOL, rank=False).tolist() == [True]
    assert cm.tokens_pass(sampled, logits, TOL).tolist() == [False]


NOT_FINITE = "must be a finite number >= 0, not"
NOT_OVERLAP = f"min_overlap must be a whole number in [1, {cm.K}] (of the K={cm.K} committed indices), not"


@pytest.mark.parametrize("field,value,message", [
    ("max_value_error", float("nan"), f"max_value_error {NOT_FINITE} nan"),  # refutes every hop
    ("max_value_error", float("inf"), f"max_value_error {NOT_FINITE} inf"),  # passes every hop
    ("max_value_error", -0.01, f"max_value_error {NOT_FINITE} -0.01"),
    ("max_logit_error", float("nan"), f"max_logit_error {NOT_FINITE} nan"),
    ("max_logit_gap", float("inf"), f"max_logit_gap {NOT_FINITE} inf"),
    ("max_logit_gap", "0.2", f"max_logit_gap {NOT_FINITE} '0.2'"),
    ("max_logit_error", None, f"max_logit_error {NOT_FINITE} None"),
    ("min_overlap", -1, f"{NOT_OVERLAP} -1"),  # passes every hop
    ("min_overlap", 0, f"{NOT_OVERLAP} 0"),  # so does this: every overlap is >= 0
    ("min_overlap", cm.K + 1, f"{NOT_OVERLAP} {cm.K + 1}"),  # refutes every hop
    ("min_overlap", 6.5, f"{NOT_OVERLAP} 6.5"),
    ("min_overlap", True, f"{NOT_OVERLAP} True"),
])
def test_a_tolerance_that_judges_nothing_cannot_be_made(field, value, message):
    with pytest.raises(ValueError) as refused:
        cm.Tolerance(**{**TOL.__dict__, field: value})
    assert str(refused.value) == f"tolerance {message}"


def test_the_bounds_themselves_are_tolerances():
    edge = cm.Tolerance(max_value_error=0.0, min_overlap=cm.K, max_logit_error=0, max_logit_gap=np.float32(0.5))
    assert edge.min_overlap == cm.K and cm.Tolerance(0.02, np.int64(1), 0.1, 0.2).min_overlap == 1
    assert cm.loosest([TOL, edge]) == cm.Tolerance(0.02, 7, 0.1, 0.5)


def test_a_calibration_file_with_a_meaningless_tolerance_is_refused_by_name(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"tolerance": {**TOL.__dict__, "max_logit_gap": float("nan")}}))  # JSON NaN
    with pytest.raises(ValueError) as refused:
        cm.tolerance_from_calibration(path)
    assert str(refused.value) == f"{path}: tolerance max_logit_gap {NOT_FINITE} nan"
    path.write_text(json.dumps({"tolerance": {**TOL.__dict__, "min_overlap": -8}}))
    with pytest.raises(ValueError) as refused:
        cm.tolerance_from_calibration(path)
    assert str(refused.value) == f"{path}: tolerance {NOT_OVERLAP} -8"
    for report, message in [([], " is not a calibration report: no tolerance object"),
                            ({"tolerance": 0.1}, " is not a calibration report: no tolerance object"),
                            ({"tolerance": {"max_value_error": 0.1}}, ": a tolerance has exactly ['max_logit_error', "
                             "'max_logit_gap', 'max_value_error', 'min_overlap'], not ['max_value_error']")]:
        path.write_text(json.dumps(report))
        with pytest.raises(ValueError) as refused:
            cm.tolerance_from_calibration(path)
        assert str(refused.value) == f"{path}{message}"
    path.write_text(json.dumps({"tolerance": TOL.__dict__}))
    assert cm.tolerance_from_calibration(path) == TOL  # an honest report still loads
