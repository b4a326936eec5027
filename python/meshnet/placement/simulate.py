"""The placement simulator (issue 51's evidence): heterogeneous fleets placed by the planner,
by memory-proportional placement (exo, llama.cpp RPC) and by Petals' least-served rule,
compared on predicted tokens/s, nodes left out and bytes moved after 10% of the nodes leave.

  PYTHONPATH=python python -m meshnet.placement.simulate --out DIR [--seed 0] [--only NAME]

Writes DIR/placement.json (every figure) and DIR/placement.md (the table). Predictions, not
measurements: every placement is timed by the same model (routes.py) from the fleet's figures.

Fleets (figures are assumptions, stated here; speeds are seconds per GiB of weights read in
decode, which is memory-bound, taken as about 60% of each device's peak memory bandwidth):
- live3: the issue's live check. Three nodes at 100%, 50% and 25% of one core (0.2, 0.4,
  0.8 s/GiB, i.e. about 8 tokens/s for the 601 MiB model on one core), memory caps that hold
  60% of the synthetic 1.07B each, loopback links; one stream.
- five: five LAN nodes (1 ms, 100 MB/s) with a 10x spread of speed (0.02 to 0.2 s/GiB) and
  3 to 8 GiB each; Llama-3-8B shape, 4 streams per route.
- consumer100-8b / consumer100-70b: 100 nodes drawn from the consumer mix below, over home
  internet (round trips 20 to 60 ms, 2.5 to 6 MB/s up, fetch 12 to 60 MB/s); 4 streams per route.
- scale10k: 10,000 nodes from the same mix and 50 models (10 synthetic 1.07B, 30 Llama-3-8B,
  10 Llama-3-70B shapes); 4 streams per route.

The consumer mix: tier shares loosely after the Steam Hardware & Software Survey of January 2026
(as reported: 16 GB of system RAM on 40.24% of machines, 8 GB of VRAM on 29.57%; the RTX 4060 the
most common card), with laptops and Macs added as an assumption for a general population:
  gaming PC, 8 GB GPU (RTX 3060/4060 class, ~270-360 GB/s): 25%, cuda 7 GiB at 0.006 s/GiB
      plus cpu 8 GiB at 0.04 s/GiB
  gaming PC, 12 GB GPU: 5%, cuda 10.5 GiB at 0.005 s/GiB plus cpu 12 GiB at 0.035 s/GiB
  16 GB laptop (dual-channel DDR4/5, ~50 GB/s): 30%, cpu 8 GiB at 0.04 s/GiB
  8 GB laptop: 15%, cpu 3 GiB at 0.06 s/GiB
  old desktop (DDR3, ~25 GB/s), 16 GB: 15%, cpu 10 GiB at 0.08 s/GiB
  Apple M-series 16 GB (~68-100 GB/s): 10%, metal 10 GiB at 0.017 s/GiB
Each node's speed is jittered by a log-normal factor (sigma 0.15) around its tier's figure.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from meshnet.placement.baselines import memory_proportional, petals_least_served
from meshnet.placement.fleet import GIB, DeviceOffer, ModelShape, NodeId, NodeOffer, Targets
from meshnet.placement.planner import plan
from meshnet.placement.plans import Plan
from meshnet.placement.shapes import LLAMA_3_70B, LLAMA_3_8B, SYNTHETIC_1_07B, renamed
from meshnet.placement.stickiness import Policy, bytes_moved, replan, retile_bytes

# (name, share, devices as (backend, GiB offered, seconds per GiB))
CONSUMER_TIERS = (
    ("gaming-pc-8gb-gpu", 0.25, (("cuda", 7.0, 0.006), ("cpu", 8.0, 0.04))),
    ("gaming-pc-12gb-gpu", 0.05, (("cuda", 10.5, 0.005), ("cpu", 12.0, 0.035))),
    ("laptop-16gb", 0.30, (("cpu", 8.0, 0.04),)),
    ("laptop-8gb", 0.15, (("cpu", 3.0, 0.06),)),
    ("old-desktop-16gb", 0.15, (("cpu", 10.0, 0.08),)),
    ("apple-m-16gb", 0.10, (("metal", 10.0, 0.017),)),
)
PLACEMENTS: dict[str, Callable[[Sequence[ModelShape], Sequence[NodeOffer], Targets], Plan]] = {
    "planner": plan, "memory_proportional": memory_proportional, "petals": petals_least_served}


def consumer_fleet(count: int, rng: np.random.Generator, prefix: str = "n") -> list[NodeOffer]:
    shares = np.array([t[1] for t in CONSUMER_TIERS])
    tiers = rng.choice(len(CONSUMER_TIERS), size=count, p=shares / shares.sum())
    jitter = rng.lognormal(0.0, 0.15, size=count)
    rtt = rng.uniform(0.020, 0.060, size=count)
    up = rng.uniform(2.5e6, 6e6, size=count)
    fetch = rng.uniform(12e6, 60e6, size=count)
    nodes = []
    width = len(str(count))
    for i in range(count):
        devices = tuple(DeviceOffer(backend, int(gib * GIB), seconds * float(jitter[i]))
                        for backend, gib, seconds in CONSUMER_TIERS[int(tiers[i])][2])
        nodes.append(NodeOffer(NodeId(f"{prefix}{i:0{width}d}"), devices, float(rtt[i]), float(up[i]), float(fetch[i])))
    return nodes


def live3_fleet() -> tuple[list[ModelShape], list[NodeOffer], Targets]:
    model = SYNTHETIC_1_07B
    cap = int(0.6 * model.total_bytes())
    nodes = [NodeOffer(NodeId(f"core-{share}"), (DeviceOffer("cpu", cap, seconds),), 0.0002, 1e9, 1e8)
             for share, seconds in (("100", 0.2), ("050", 0.4), ("025", 0.8))]
    return [model], nodes, Targets(kv_tokens_per_session=2048, sessions=1)


def five_fleet() -> tuple[list[ModelShape], list[NodeOffer], Targets]:
    speeds = (0.02, 0.035, 0.06, 0.11, 0.2)
    memory = (3.0, 8.0, 4.0, 8.0, 6.0)
    nodes = [NodeOffer(NodeId(f"lan-{i}"), (DeviceOffer("cpu", int(gib * GIB), s),), 0.001, 1e8, 1e8)
             for i, (s, gib) in enumerate(zip(speeds, memory))]
    return [LLAMA_3_8B], nodes, Targets(kv_tokens_per_session=2048, sessions=4)


def scale_models() -> list[ModelShape]:
    shapes = [SYNTHETIC_1_07B] * 10 + [LLAMA_3_8B] * 30 + [LLAMA_3_70B] * 10
    return [renamed(shape, f"model-{i:02d}-{shape.name}") for i, shape in enumerate(shapes)]


def fleets(seed: int) -> dict[str, Callable[[], tuple[list[ModelShape], list[NodeOffer], Targets]]]:
    targets = Targets(kv_tokens_per_session=2048, sessions=4)
    return {
        "live3": live3_fleet,
        "five": five_fleet,
        "consumer100-8b": lambda: ([LLAMA_3_8B], consumer_fleet(100, np.random.default_rng(seed)), targets),
        "consumer100-70b": lambda: ([LLAMA_3_70B], consumer_fleet(100, np.random.default_rng(seed)), targets),
        "scale10k": lambda: (scale_models(), consumer_fleet(10_000, np.random.default_rng(seed)), targets),
    }


def summary(result: Plan, models: Sequence[ModelShape]) -> dict:
    """Predicted figures of a plan: per model the best route's single-stream tokens/s, and the
    aggregate over every route."""
    single = {}
    for model in models:
        best = result.best_route(model.name)
        single[model.name] = 0.0 if best is None else 1.0 / best.decode_seconds
    values = list(single.values())
    return {
        "aggregate_tokens_per_second": result.tokens_per_second(),
        "single_stream_tokens_per_second_median": float(np.median(values)),
        "single_stream_tokens_per_second_min": float(np.min(values)),
        "routes": len(result.routes),
        "nodes_assigned": len(result.assignments),
        "nodes_left_out": len(result.left_out),
        "models_uncovered": sum(1 for v in values if v == 0.0),
    }


def churn(nodes: Sequence[NodeOffer], fraction: float, rng: np.random.Generator) -> list[NodeOffer]:
    """`nodes` less a random `fraction` of them (the ones that leave)."""
    leaving = set(rng.choice(len(nodes), size=max(1, round(fraction * len(nodes))), replace=False).tolist())
    return [n for i, n in enumerate(nodes) if i not in leaving]


def run_fleet(name: str, build: Callable, seed: int) -> dict:
    models, nodes, targets = build()
    result = {"fleet": name, "nodes": len(nodes), "models": len(models), "sessions": targets.sessions}
    remaining = churn(nodes, 0.10, np.random.default_rng(seed + 1))
    for placement, place in PLACEMENTS.items():
        started = time.perf_counter()
        before = place(models, nodes, targets)
        seconds = time.perf_counter() - started
        entry = {"wall_seconds": seconds, **summary(before, models)}
        if placement == "planner":
            repaired = replan(before, models, remaining, targets, Policy(), now=0.0, last_adopted=0.0)  # in cooldown
            after = repaired.plan
            entry["churn_bytes_moved"] = bytes_moved(repaired.moves)
            entry["churn_seconds_to_coverage"] = max((m.seconds for m in repaired.moves), default=0.0)
            started = time.perf_counter()
            decision = replan(before, models, remaining, targets, Policy(), now=1e9, last_adopted=None)
            entry["replan"] = {"wall_seconds": time.perf_counter() - started, "adopted": decision.adopted,
                               "reason": decision.reason, "bytes_moved": bytes_moved(decision.moves),
                               "aggregate_tokens_per_second": decision.plan.tokens_per_second()}
            entry["churn_retile_bytes"] = retile_bytes(before, plan(models, remaining, targets), models, remaining)
        else:
            after = place(models, remaining, targets)
            entry["churn_bytes_moved"] = retile_bytes(before, after, models, remaining)
        entry["after_churn"] = summary(after, models)
        result[placement] = entry
    return result


def table(results: Sequence[dict]) -> str:
    lines = ["| fleet | placement | aggregate tok/s | single-stream tok/s (median over models) | routes | "
             "nodes left out | GiB moved after 10% leave | aggregate tok/s after | plan wall time (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for placement in PLACEMENTS:
            e = r[placement]
            lines.append(
                f"| {r['fleet']} ({r['nodes']} nodes, {r['models']} models) | {placement} | "
                f"{e['aggregate_tokens_per_second']:.2f} | {e['single_stream_tokens_per_second_median']:.2f} | "
                f"{e['routes']} | {e['nodes_left_out']} | {e['churn_bytes_moved'] / GIB:.2f} | "
                f"{e['after_churn']['aggregate_tokens_per_second']:.2f} | {e['wall_seconds']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for placement.json and placement.md")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", help="run only this fleet (repeatable)")
    args = parser.parse_args(argv)
    chosen = {k: v for k, v in fleets(args.seed).items() if not args.only or k in args.only}
    results = [run_fleet(name, build, args.seed) for name, build in chosen.items()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "placement.json").write_text(json.dumps({"seed": args.seed, "fleets": results}, indent=1) + "\n")
    (args.out / "placement.md").write_text(table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
