"""Commitments on synthetic rows: the replay's rounding noise passes, a changed row does not."""

from __future__ import annotations

import numpy as np

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
