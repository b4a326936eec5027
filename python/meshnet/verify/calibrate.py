"""`tools/bazel run //python:verify_calibrate -- --out DIR`: how far honest hops differ, and
which cheats the commitments catch (issue 17's calibration; docs/evidence/verification/).

Per compute backend (ADR 0015): `--device vulkan0` runs everything below on that device (the
greedy continuations too) and writes a calibration for that backend alone, which a verifier
uses to judge hops on it (`//python:verifier --device vulkan=vulkan0 --calibration vulkan=PATH`).

Sequences: each prompt plus llama.cpp's greedy continuation (what a session's audit replays).
A 3-hop chain [0,10) [10,20) [20,30) runs each sequence (//cpp/engine:dump_boundaries):

- as a route computes it ("commit" runs): the prompt in one prefill, then one position per
  step, with 2 threads and with 1, and in chunks of 7 positions;
- as an audit replays it: one teacher-forced prefill of the whole sequence, 2 threads and 1 (on a
  GPU backend, as the session computed it: the prompt in one prefill, then a position per step;
  audit.ReplayPlan.stepwise), and there the whole sequence in one prefill counts as an honest
  commit run too (the prefill kernels on rows a session decoded: a failover's replay, other chunks).

Honest divergence is every commit run against every replay. The tolerance is set from the
first half of the sequences only (the calibration half) by a rule fixed here before any cheat
is scored: 25% above the largest honest figure seen (value error, logit error, logit gap), and
the smallest honest index overlap. The other half (the evaluation half) then gives the false
positives of honest runs and each cheat's detection rate per position. Cheats, all at hop 1
([10,20)) except the forged token (the last hop): Gaussian noise of 1%, 10% and 100% of each
row's RMS added to its output; garbage (random rows of the same RMS); skipping layer 15; the
same model requantized to Q4_0 (llama-quantize --allow-requantize from the bundled Q4_1);
forged tokens (uniformly random) at the last hop. Per audited session an audit checks
`--positions` random positions per hop; the detection curve is P(caught within n audited
sessions) = 1 - (1 - p)^n from the measured per-session p (`--seed` fixes the draws).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from meshnet.text.tokenizer import GgufTokenizer
from meshnet.recipe.recipe import compute_backend_of
from meshnet.verify import boundaries
from meshnet.verify import commitment as cm
from meshnet.verify import curves

CHAIN = "0:10,10:20,20:30"
SKIP_LAYER_CHAIN = "0:10,10:15,16:20,20:30"  # hop 1 leaves layer 15 out; its output is boundary 2
PROMPTS = [
    "The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):", "Water boils at",
    "List three primary colors:", "Once upon a time", "The largest planet is", "1, 2, 3, 4,",
    "Explain photosynthesis in one sentence.", "import numpy as np", "The quick brown fox",
    "Translate 'good morning' to Spanish:", "SELECT name FROM", "My favourite recipe is",
    "In 1969, astronauts", "A prime number is",
]
MARGIN = 1.25  # the tolerance rule: 25% above the largest honest figure (fixed before scoring)
COMMIT_RUNS = {"route_t2": ("P:1", 2), "route_t1": ("P:1", 1), "chunks7_t2": ("7", 2)}
REPLAY_RUNS = {"prefill_t2": ("N", 2), "prefill_t1": ("N", 1)}
# On a GPU backend an audit replays as the session computed (audit.ReplayPlan.stepwise): the prompt
# in one prefill, then one position per step.
STEPWISE_REPLAY_RUNS = {"stepwise_t2": ("P:1", 2), "stepwise_t1": ("P:1", 1)}
# There an honest epoch that prefilled more than its prompt (a failover's replayed tokens, another
# --max_prefill_chunk) computed those rows with the prefill kernels: the worst such case, the whole
# sequence in one prefill, is an honest run too, so that every sequence (not only prompts longer
# than the 8 rows where the kernels switch) measures the difference.
STEPWISE_EXTRA_COMMIT_RUNS = {"prefill_t2": ("N", 2)}


def log(**event) -> None:
    print(json.dumps(event), file=sys.stderr, flush=True)


class Runner:
    def __init__(self, dump: Path, gguf: Path, device: str = "cpu") -> None:
        self.dump, self.gguf, self.device = dump, gguf, device
        self.replay_seconds: list[tuple[float, int]] = []

    def run(self, tokens: list[int], chain: str, batch: str, threads: int, replay: bool = False) -> dict:
        """Boundary rows per range and the last hop's logits for one run of the sequence (`replay`:
        one an audit makes, timed)."""
        started = time.perf_counter()
        out = boundaries.run_chain(self.dump, self.gguf, tokens, chain, batch.replace("N", str(len(tokens))), threads,
                                   device=self.device)
        if replay:
            self.replay_seconds.append((time.perf_counter() - started, len(tokens)))
        return out


def sequences(gguf: Path, greedy: Path, continuation: int, prompts: list[str], device: str = "cpu") -> list[list[int]]:
    """Each prompt and the whole model's greedy continuation on `device` (what a session there produces)."""
    tokenizer = GgufTokenizer.from_gguf(gguf)
    out = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        on_device = ["--device", device] if device != "cpu" else []
        proc = subprocess.run([str(greedy), *on_device, str(gguf), str(continuation), *map(str, ids)], check=True,
                              capture_output=True, text=True)
        out.append(ids + json.loads(proc.stdout.strip().splitlines()[-1])["tokens"])
    return out


def figures(commit: dict, replay: dict, prompt_len: int) -> dict:
    """Per position (decode positions from prompt_len - 1 on: what a session produced): the
    hidden mismatch at hop 0 and hop 1's outputs and the token mismatch at the last hop."""
    out = {}
    for hop in (0, 1):
        err, overlap = cm.hidden_mismatch(cm.commit_hidden(commit["rows"][hop]), replay["rows"][hop])
        out[f"hop{hop}_value_error"], out[f"hop{hop}_overlap"] = err[prompt_len - 1:], overlap[prompt_len - 1:]
    tokens = commit.get("tokens", commit["logits"].argmax(axis=1))
    token_commit = cm.TokenCommitment(np.asarray(tokens, dtype=np.int32),
                                      commit["logits"][np.arange(len(tokens)), tokens].astype(np.float16))
    err, gap = cm.token_mismatch(token_commit, replay["logits"])
    out["last_logit_error"], out["last_logit_gap"] = err[prompt_len - 1:], gap[prompt_len - 1:]
    return out


def failures(fig: dict, tol: cm.Tolerance) -> dict[str, np.ndarray]:
    """bool [positions] per hop: the positions whose commitment the replay refutes."""
    return {
        "hop0": (fig["hop0_value_error"] > tol.max_value_error) | (fig["hop0_overlap"] < tol.min_overlap),
        "hop1": (fig["hop1_value_error"] > tol.max_value_error) | (fig["hop1_overlap"] < tol.min_overlap),
        "last": (fig["last_logit_error"] > tol.max_logit_error) | (fig["last_logit_gap"] > tol.max_logit_gap),
    }


def tolerance_from(honest: list[dict]) -> cm.Tolerance:
    def most(key: str) -> float:
        return float(max(f[k].max() for f in honest for k in f if k.endswith(key)))

    return cm.Tolerance(max_value_error=most("value_error") * MARGIN,
                        min_overlap=int(min(f[k].min() for f in honest for k in f if k.endswith("overlap"))),
                        max_logit_error=most("logit_error") * MARGIN, max_logit_gap=most("logit_gap") * MARGIN)


def perturbed(base: dict, hop: int, change: Callable[[np.ndarray], np.ndarray]) -> dict:
    rows = list(base["rows"])
    rows[hop] = change(rows[hop])
    return {"rows": rows, "logits": base["logits"]}


def rms(rows: np.ndarray) -> np.ndarray:
    return np.sqrt(np.mean(np.square(rows, dtype=np.float64), axis=1, keepdims=True)).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True, type=Path)
    parser.add_argument("--dump-boundaries", required=True, type=Path,
                        help="//cpp/engine:dump_boundaries, or its build with --device's backend (dump_boundaries_vulkan)")
    parser.add_argument("--greedy", required=True, type=Path, help="//cpp/engine:greedy, or greedy_vulkan")
    parser.add_argument("--device", default="cpu",
                        help="where every run computes (ADR 0015: each compute backend has its own calibration)")
    parser.add_argument("--vulkan-dump-boundaries", type=Path, help=argparse.SUPPRESS)  # set by bazel run
    parser.add_argument("--vulkan-greedy", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--quantize", required=True, type=Path, help="llama-quantize (for the Q4_0 substitute)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--continuation", type=int, default=128, help="greedy tokens after each prompt")
    parser.add_argument("--positions", type=int, default=16, help="positions an audit checks per hop")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="use the first N prompts (half calibrate)")
    args = parser.parse_args(argv)
    try:
        backend = compute_backend_of(args.device)
    except ValueError as err:
        parser.error(str(err))
    if backend == "vulkan" and args.vulkan_dump_boundaries and args.vulkan_greedy:
        args.dump_boundaries, args.greedy = args.vulkan_dump_boundaries, args.vulkan_greedy
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    tokenizer = GgufTokenizer.from_gguf(args.gguf)

    with tempfile.TemporaryDirectory(prefix="meshnet-verify-") as tmp:
        work = Path(tmp)
        q4_0 = work / "q4_0.gguf"
        subprocess.run([str(args.quantize), "--allow-requantize", str(args.gguf.resolve()), str(q4_0), "Q4_0"],
                       check=True, capture_output=True)
        runner = Runner(args.dump_boundaries, args.gguf.resolve(), args.device)
        seqs = sequences(args.gguf.resolve(), args.greedy, args.continuation, PROMPTS[:args.prompts], args.device)
        half = len(seqs) // 2
        honest: dict[str, list[dict]] = {"calibration": [], "evaluation": []}
        cheats: dict[str, list[dict]] = {}
        for i, tokens in enumerate(seqs):
            split = "calibration" if i < half else "evaluation"
            prompt_len = len(tokenizer.encode(PROMPTS[i]))
            replays = {name: runner.run(tokens, CHAIN, b.replace("P", str(prompt_len)), t, replay=True)
                       for name, (b, t) in (REPLAY_RUNS if backend == "cpu" else STEPWISE_REPLAY_RUNS).items()}
            commit_runs = COMMIT_RUNS if backend == "cpu" else {**COMMIT_RUNS, **STEPWISE_EXTRA_COMMIT_RUNS}
            commits = {name: runner.run(tokens, CHAIN, b.replace("P", str(prompt_len)), t)
                       for name, (b, t) in commit_runs.items()}
            for replay in replays.values():
                for commit in commits.values():
                    honest[split].append(figures(commit, replay, prompt_len))
            log(event="sequence", index=i, split=split, positions=len(tokens) - prompt_len + 1)
            if split == "calibration":
                continue
            base, replay = commits["route_t2"], next(iter(replays.values()))
            skip = runner.run(tokens, SKIP_LAYER_CHAIN, f"{prompt_len}:1", 2)
            quant = runner.run(tokens, f"0:10,10:20@{q4_0},20:30", f"{prompt_len}:1", 2)
            forged = dict(base, tokens=rng.integers(0, base["logits"].shape[1], len(tokens)))
            variants = {
                "noise_1pct": perturbed(base, 1, lambda r: r + rng.normal(0, 0.01, r.shape).astype(np.float32) * rms(r)),
                "noise_10pct": perturbed(base, 1, lambda r: r + rng.normal(0, 0.1, r.shape).astype(np.float32) * rms(r)),
                "noise_100pct": perturbed(base, 1, lambda r: r + rng.normal(0, 1.0, r.shape).astype(np.float32) * rms(r)),
                "garbage": perturbed(base, 1, lambda r: rng.normal(0, 1.0, r.shape).astype(np.float32) * rms(r)),
                "skip_layer": {"rows": [skip["rows"][0], skip["rows"][2]], "logits": skip["logits"]},
                "q4_0_substitute": quant,
                "forged_tokens": forged,
            }
            for name, variant in variants.items():
                cheats.setdefault(name, []).append(figures(variant, replay, prompt_len))

    tol = tolerance_from(honest["calibration"])
    report = {"compute_backend": backend, "device": args.device,
              "tolerance": tol.__dict__, "margin": MARGIN, "k": cm.K,
              "commitment_bytes_per_position": {"hidden": cm.K * 4, "token": 6},
              "sequences": len(seqs), "calibration_sequences": half,
              "honest": summarize(honest["evaluation"], tol), "honest_calibration": summarize(honest["calibration"], tol),
              "cheats": {name: summarize(figs, tol, culprit="last" if name == "forged_tokens" else "hop1")
                         for name, figs in cheats.items()}}
    for name, figs in cheats.items():
        culprit = "last" if name == "forged_tokens" else "hop1"
        report["cheats"][name]["per_session"] = per_session(figs, tol, culprit, args.positions, rng)
    seconds = sum(s for s, _ in runner.replay_seconds)
    tokens_replayed = sum(n for _, n in runner.replay_seconds)
    report["verifier_seconds_per_token"] = seconds / tokens_replayed
    report["distributions"] = {"honest": distributions(honest["evaluation"] + honest["calibration"]),
                               **{name: distributions(figs) for name, figs in cheats.items()}}
    (args.out / "calibration.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    curves.plot(report, args.out / "detection.png")
    print(json.dumps({k: v for k, v in report.items() if k != "distributions"}, indent=1, default=float))
    return 0


def summarize(figs: list[dict], tol: cm.Tolerance, culprit: str = "") -> dict:
    """Positions checked and refuted per hop (and, for a cheat, the culprit hop's rate)."""
    out: dict = {}
    for hop in ("hop0", "hop1", "last"):
        failed = np.concatenate([failures(f, tol)[hop] for f in figs])
        out[hop] = {"positions": int(failed.size), "refuted": int(failed.sum())}
    if culprit:
        out["detection_per_position"] = out[culprit]["refuted"] / out[culprit]["positions"]
    return out


def per_session(figs: list[dict], tol: cm.Tolerance, culprit: str, positions: int, rng) -> dict:
    """P(an audit of `positions` random positions of the culprit hop catches it), per session,
    averaged over the evaluation sessions and 200 draws each; the curve over audited sessions."""
    caught = []
    for f in figs:
        failed = failures(f, tol)[culprit]
        for _ in range(200):
            pick = rng.choice(failed.size, size=min(positions, failed.size), replace=False)
            caught.append(bool(failed[pick].any()))
    p = float(np.mean(caught))
    curve = {n: 1 - (1 - p) ** n for n in (1, 2, 3, 5, 10, 20, 50)}
    needed = next((n for n in range(1, 10_000) if 1 - (1 - p) ** n >= 0.99), None) if p > 0 else None
    return {"p_session": p, "curve": curve, "sessions_for_99pct": needed}


def distributions(figs: list[dict]) -> dict:
    """Quantiles of each figure, for the evidence's tables."""
    out = {}
    for key in figs[0]:
        values = np.concatenate([f[key] for f in figs]).astype(np.float64)
        out[key] = {q: float(np.quantile(values, q)) for q in (0.0, 0.01, 0.5, 0.99, 1.0)}
    return out


if __name__ == "__main__":
    sys.exit(main())
