"""Commitments to what a hop computed, and their check against an audit's replay (issue 17).

A hop commits, per position, to the hidden state it hands on: the indices of its K largest
magnitudes and those K values rounded to float16 (TOPLOC's idea, without its polynomial
packing: 4 bytes per kept value, K * 4 bytes per position). The last hop commits to the token it
sampled and that token's logit. An audit recomputes the same positions (teacher-forced, another
batch shape, another replica) and checks each commitment against its own row:

- hidden: `value_error` is the largest relative difference between a committed value and the
  replay's value at that index (relative to the larger of |replay value| and the row's RMS, so
  an index where the replay is near zero cannot blow it up), and `overlap` is how many of the
  committed indices are among the replay's top 2K magnitudes (near-ties may swap ranks, not
  leave the head of the distribution).
- token: `logit_error` (committed logit vs the replay's logit of that token) and `logit_gap`
  (how far that token's replay logit is below the replay's best: 0 for its argmax; honest runs
  differ only on near-ties).

A position passes when each figure is within a `Tolerance`. Tolerances are calibrated from
honest divergence only (meshnet.verify.calibrate), never from a cheat's numbers; one whose bounds
cannot tell an honest hop from a cheat (NaN, infinite, negative) cannot be made. numpy only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path

import numpy as np

K = 8  # values kept per position


@dataclasses.dataclass(frozen=True)
class HiddenCommitment:
    indices: np.ndarray  # uint16 [positions, K]
    values: np.ndarray  # float16 [positions, K]

    @property
    def bytes_per_position(self) -> int:
        return self.indices.shape[1] * (self.indices.itemsize + self.values.itemsize)


@dataclasses.dataclass(frozen=True)
class TokenCommitment:
    tokens: np.ndarray  # int32 [positions]
    logits: np.ndarray  # float16 [positions]: each token's logit

    bytes_per_position: int = 6


@dataclasses.dataclass(frozen=True)
class Tolerance:
    max_value_error: float  # hidden: largest relative value difference allowed
    min_overlap: int  # hidden: committed indices that must be in the replay's top 2K
    max_logit_error: float  # token: |committed logit - replay logit| allowed
    max_logit_gap: float  # token: replay best logit - replay logit of the token allowed

    def __post_init__(self) -> None:
        """ValueError for a bound that judges nothing (issue 55, finding 16): NaN or a negative
        error refutes every hop, infinity or an overlap below 1 passes every hop, an overlap
        above K refutes every hop."""
        for name in ("max_value_error", "max_logit_error", "max_logit_gap"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"tolerance {name} must be a finite number >= 0, not {value!r}")
        overlap = self.min_overlap
        if not isinstance(overlap, numbers.Integral) or isinstance(overlap, bool) or not 1 <= overlap <= K:
            raise ValueError(f"tolerance min_overlap must be a whole number in [1, {K}] (of the K={K} committed "
                             f"indices), not {overlap!r}")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def tolerance_from_calibration(path, compute_backend: str = "cpu") -> Tolerance:
    """The tolerance a calibration run set (meshnet.verify.calibrate's calibration.json) on
    `compute_backend`; ValueError if the run calibrated another backend (absent: the CPU), or
    the file is not such a report or its tolerance judges nothing (`Tolerance`)."""
    report = json.loads(Path(path).read_text())
    if not isinstance(report, dict) or not isinstance(report.get("tolerance"), dict):
        raise ValueError(f"{path} is not a calibration report: no tolerance object")
    calibrated = report.get("compute_backend", "cpu")
    if calibrated != compute_backend:
        raise ValueError(f"{path} calibrates the {calibrated} backend, not {compute_backend}")
    fields = {f.name for f in dataclasses.fields(Tolerance)}
    if set(report["tolerance"]) != fields:
        raise ValueError(f"{path}: a tolerance has exactly {sorted(fields)}, not {sorted(report['tolerance'])}")
    try:
        return Tolerance(**report["tolerance"])
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def loosest(tolerances) -> Tolerance:
    """What each of `tolerances` allows, together: a boundary after ranges computed on several
    backends carries the arithmetic differences of each (ADR 0015)."""
    tolerances = list(tolerances)
    return Tolerance(max(t.max_value_error for t in tolerances), min(t.min_overlap for t in tolerances),
                     max(t.max_logit_error for t in tolerances), max(t.max_logit_gap for t in tolerances))


def commit_hidden(rows: np.ndarray, k: int = K) -> HiddenCommitment:
    """rows: float32 [positions, n_embd]."""
    if rows.ndim != 2 or rows.shape[1] > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"rows must be [positions, n_embd <= 65536], got {rows.shape}")
    indices = np.argpartition(-np.abs(rows), k - 1, axis=1)[:, :k]
    return HiddenCommitment(indices.astype(np.uint16), np.take_along_axis(rows, indices, axis=1).astype(np.float16))


def commit_tokens(tokens: np.ndarray, logits: np.ndarray) -> TokenCommitment:
    """tokens: the sampled token per position; logits: float32 [positions, n_vocab]."""
    tokens = np.asarray(tokens, dtype=np.int32)
    return TokenCommitment(tokens, logits[np.arange(len(tokens)), tokens].astype(np.float16))


def hidden_mismatch(commitment: HiddenCommitment, replay: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value_error float [positions], overlap int [positions]) of `commitment` against the
    replay's rows (float32 [positions, n_embd])."""
    indices = commitment.indices.astype(np.int64)
    k = indices.shape[1]
    at = np.take_along_axis(replay, indices, axis=1)
    rms = np.sqrt(np.mean(np.square(replay, dtype=np.float64), axis=1, keepdims=True))
    scale = np.maximum(np.abs(at), rms)
    value_error = np.max(np.abs(commitment.values.astype(np.float64) - at) / np.maximum(scale, 1e-30), axis=1)
    head = np.argpartition(-np.abs(replay), 2 * k - 1, axis=1)[:, :2 * k]
    overlap = np.array([np.isin(c, h).sum() for c, h in zip(indices, head)], dtype=np.int64)
    return value_error, overlap


def token_mismatch(commitment: TokenCommitment, replay_logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(logit_error, logit_gap), float [positions], of `commitment` against the replay's logits."""
    rows = np.arange(len(commitment.tokens))
    at = replay_logits[rows, commitment.tokens].astype(np.float64)
    return np.abs(commitment.logits.astype(np.float64) - at), replay_logits.max(axis=1) - at


def hidden_passes(commitment: HiddenCommitment, replay: np.ndarray, tol: Tolerance) -> np.ndarray:
    """bool [positions]: which committed positions the replay confirms."""
    value_error, overlap = hidden_mismatch(commitment, replay)
    return (value_error <= tol.max_value_error) & (overlap >= tol.min_overlap)


def tokens_pass(commitment: TokenCommitment, replay_logits: np.ndarray, tol: Tolerance,
                rank: bool = True) -> np.ndarray:
    """bool [positions]; `rank`: whether each token must also be within `max_logit_gap` of the
    replay's best (greedy decoding only: a sampled or constrained token need not be near it)."""
    logit_error, logit_gap = token_mismatch(commitment, replay_logits)
    return (logit_error <= tol.max_logit_error) & ((logit_gap <= tol.max_logit_gap) | (not rank))
