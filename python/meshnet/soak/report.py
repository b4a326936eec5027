"""The chaos soak's results: what was served and refused over time, and the verdict.

`summarize` turns the run's outcomes, fault events, attack results, end-state checks and RSS
samples into one JSON-ready dict (`results.json`); `timeline` bins outcomes by `bin_s` seconds;
`plot` draws throughput and errors over time, with the faults marked, as PNGs. The verdict
(`passed`) is the issue's: no wrong token, no session or KV cell left on any hop, the RSS of every
process that lived at least RSS_JUDGED_S past its own warm-up within RSS_GROWTH_MAX of its size
after that warm-up (a node killed by a fault and launched again is a new process, judged on its
own lifetime), every attack held.
"""

from __future__ import annotations

import collections
import pathlib
from typing import Iterable, Optional, Sequence

from meshnet.soak.attacks import AttackResult
from meshnet.soak.faults import FaultEvent
from meshnet.soak.load import Outcome

RSS_GROWTH_MAX = 1.5  # end RSS over RSS after warm-up, per process
RSS_WARMUP_S = 120.0  # from a process's first sample: loading, first batches, allocator pools
RSS_JUDGED_S = 300.0  # a process is judged when it lived this long after its warm-up


def timeline(outcomes: Sequence[Outcome], started: float, ended: float, bin_s: float = 10.0) -> list[dict]:
    bins = max(1, int((ended - started) // bin_s) + 1)
    rows = [{"t_s": i * bin_s, "served": 0, "tokens": 0, "errors": collections.Counter()} for i in range(bins)]
    for o in outcomes:
        row = rows[min(bins - 1, max(0, int((o.ended - started) // bin_s)))]
        if o.status == "ok":
            row["served"] += 1
            row["tokens"] += o.tokens
        else:
            row["errors"][o.status] += 1
    for row in rows:
        row["tokens_per_s"] = round(row["tokens"] / bin_s, 2)
        row["errors"] = dict(row["errors"])
    return rows


def rss_growth(samples: dict[str, list[tuple[float, int]]], warmup_s: float = RSS_WARMUP_S,
               judged_s: float = RSS_JUDGED_S) -> dict[str, dict]:
    """Per process (name -> its (time, RSS bytes) samples) that lived `judged_s` past its own
    warm-up (`warmup_s` from its first sample): RSS after warm-up, at its end, the largest, and
    the ratio of end to after-warm-up."""
    out = {}
    for name, series in samples.items():
        if not series:
            continue
        warm = [(t, rss) for t, rss in series if t >= series[0][0] + warmup_s]
        if len(warm) < 2 or warm[-1][0] - warm[0][0] < judged_s:
            continue
        first, last = warm[0][1], warm[-1][1]
        out[name] = {"after_warmup_mib": round(first / 2**20, 1), "end_mib": round(last / 2**20, 1),
                     "max_mib": round(max(r for _, r in warm) / 2**20, 1), "growth": round(last / first, 3),
                     "judged_s": round(warm[-1][0] - warm[0][0], 1)}
    return out


def summarize(config: dict, outcomes: Sequence[Outcome], faults: Iterable[FaultEvent],
              attacks: Sequence[AttackResult], leaks: dict, rss: dict[str, dict], started: float,
              ended: float, idle: Optional[dict] = None) -> dict:
    """`idle`: what soak/main.py found once the load stopped ({"busy": processes still using CPU,
    "unroutable": nodes left out of routes}); None where it was not looked at."""
    by_kind = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_kind[o.kind][o.status] += 1
    wrong = [o for o in outcomes if o.wrong]
    attack_counts = collections.defaultdict(lambda: {"held": 0, "not_held": 0})
    for a in attacks:
        attack_counts[a.kind]["held" if a.held else "not_held"] += 1
    faults = list(faults)
    checks = {
        "wrong_tokens": len(wrong) == 0,
        "leaked_sessions_or_kv": not leaks,
        "rss_bounded": all(r["growth"] <= RSS_GROWTH_MAX for r in rss.values()),
        "attacks_held": all(c["not_held"] == 0 for c in attack_counts.values()),
    }
    if idle is not None:
        checks["idle_after_end"] = not idle["busy"]
        checks["every_node_routable_after_end"] = not idle["unroutable"]
    return {
        "config": config,
        "seconds": round(ended - started, 1),
        "requests": len(outcomes),
        "served": sum(o.status == "ok" for o in outcomes),
        "tokens": sum(o.tokens for o in outcomes if o.status == "ok"),
        "errors_by_code": dict(collections.Counter(o.status for o in outcomes if o.status != "ok")),
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "wrong_tokens": len(wrong),
        "wrong_examples": [o.detail for o in wrong[:10]],
        "faults": dict(collections.Counter(f.kind for f in faults)),
        "fault_events": [{"kind": f.kind, "target": f.target, "at_s": round(f.started - started, 1),
                          "undone_after_s": round(f.ended - f.started, 1) if f.ended else None} for f in faults],
        "attacks": {k: v for k, v in sorted(attack_counts.items())},
        "attacks_not_held": [{"kind": a.kind, "at_s": round(a.at - started, 1), "detail": a.detail}
                             for a in attacks if not a.held][:20],
        "leaks_after_end": leaks,
        "busy_after_end": (idle or {}).get("busy"),
        "unroutable_after_end": (idle or {}).get("unroutable"),
        "rss": rss,
        "rss_growth_max": RSS_GROWTH_MAX,
        "checks": checks,
        "passed": all(checks.values()),
    }


def plot(rows: Sequence[dict], faults: Iterable[FaultEvent], started: float, out: pathlib.Path) -> list[pathlib.Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: E402  (the backend first)

    t = [r["t_s"] / 60 for r in rows]
    marks = [(f.kind, (f.started - started) / 60) for f in faults]
    colors = {"kill9_node": "tab:red", "sigstop_worker": "tab:orange", "tracker_restart": "tab:purple",
              "link_cut": "tab:green"}
    written = []
    for name, series, ylabel in (
            ("throughput", {"tokens/s": [r["tokens_per_s"] for r in rows],
                            "requests served / 10 s": [r["served"] for r in rows]}, "per 10 s bin"),
            ("errors", {code: [r["errors"].get(code, 0) for r in rows]
                        for code in sorted({c for r in rows for c in r["errors"]})}, "failed requests / 10 s")):
        fig, ax = plt.subplots(figsize=(11, 4))
        for label, ys in series.items():
            ax.plot(t, ys, label=label, linewidth=1.2)
        for kind, x in marks:
            ax.axvline(x, color=colors.get(kind, "grey"), alpha=0.35, linewidth=0.8)
        ax.set_xlabel("minutes (vertical lines: faults; red kill -9, orange SIGSTOP, purple tracker+relay restart, "
                      "green link cut)")
        ax.set_ylabel(ylabel)
        if series:
            ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
