"""Checks a benchmark results JSON against docs/performance-contract.json.

  bazel run //python:check_contract -- --results results.json [--contract docs/performance-contract.json]

Every check compares two figures of the same run (a ratio), prints its measured ratio with
PASS/FAIL, and the command exits 1 if any check fails or lacks its inputs (a lane that did not
run is reported as missing, never as passing). A check of kind "absolute" compares one figure
with a fixed value (the drift floor). Results layout: {"lanes": {lane: {metric: value, ...,
"nodes": [{"peak_rss_bytes", "weight_bytes", "kv_bytes"}, ...]}}}; the bench's results.json
carries that layout under "contract_figures", which is read when present.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Optional

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Outcome:
    check: str
    passed: bool
    measured: Optional[float]  # the ratio (or worst per-node ratio); None when inputs are missing
    required: str  # e.g. ">= 0.95"
    detail: str
    contract_set: str = "v1"
    skipped: bool = False  # a when_present check whose lanes did not run


def _lanes(results: dict) -> dict:
    return results.get("contract_figures", results).get("lanes", {})


def _figure(results: dict, lane: str, metric: str) -> Optional[float]:
    value = _lanes(results).get(lane, {}).get(metric)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _per_node_rss(check: dict, results: dict) -> Outcome:
    nodes = _lanes(results).get(check["lane"], {}).get("nodes")
    required = f"<= {check['ratio']} x (weights + KV) + {check['slack_mib']} MiB"
    if not nodes:
        return Outcome(check["id"], False, None, required, f"lane {check['lane']} has no per-node figures")
    worst = 0.0
    for node in nodes:
        budget = check["ratio"] * (node["weight_bytes"] + node["kv_bytes"]) + check["slack_mib"] * MIB
        worst = max(worst, node["peak_rss_bytes"] / budget)
    return Outcome(check["id"], worst <= 1.0, worst, required, f"worst node uses {worst:.3f} of its budget")


def node_budget(contract_doc: dict) -> Optional[dict]:
    """The per-node RSS rule ({"ratio", "slack_mib"}) of the contract's per_node_rss check, for
    reports that show each node's budget; None when the contract has none."""
    for check in contract_doc.get("checks", []):
        if check.get("kind") == "per_node_rss":
            return {"ratio": check["ratio"], "slack_mib": check["slack_mib"]}
    return None


def _absolute(check: dict, results: dict) -> Outcome:
    required = f"{check['op']} {check['value']}"
    value = _figure(results, check["lane"], check["metric"])
    if value is None:
        return Outcome(check["id"], False, None, required, f"not measured: {check['lane']}.{check['metric']}")
    passed = value >= check["value"] if check["op"] == ">=" else value <= check["value"]
    return Outcome(check["id"], passed, value, required, f"{check['lane']}.{check['metric']}={value:g}")


def evaluate(contract: dict, results: dict) -> list[Outcome]:
    outcomes = []
    for check in contract["checks"]:
        outcome = _evaluate_one(check, results)
        skipped = bool(check.get("when_present")) and outcome.measured is None
        outcomes.append(dataclasses.replace(outcome, contract_set=check.get("set", "v1"), skipped=skipped))
    return outcomes


def _evaluate_one(check: dict, results: dict) -> Outcome:
    if check.get("kind") == "per_node_rss":
        return _per_node_rss(check, results)
    if check.get("kind") == "absolute":
        return _absolute(check, results)
    required = f"{check['op']} {check['ratio']}"
    value = _figure(results, check["lane"], check["metric"])
    base = _figure(results, check["baseline_lane"], check["baseline_metric"])
    if value is None or base is None or base == 0:
        missing = [f"{lane}.{metric}" for lane, metric, v in ((check["lane"], check["metric"], value),
                                                              (check["baseline_lane"], check["baseline_metric"], base))
                   if v is None or v == 0]
        return Outcome(check["id"], False, None, required, f"not measured: {', '.join(missing)}")
    ratio = value / base
    passed = ratio >= check["ratio"] if check["op"] == ">=" else ratio <= check["ratio"]
    return Outcome(check["id"], passed, ratio, required,
                   f"{check['lane']}.{check['metric']}={value:g} / "
                   f"{check['baseline_lane']}.{check['baseline_metric']}={base:g}")


def verdict(o: Outcome) -> str:
    return "SKIP" if o.skipped else "PASS" if o.passed else "FAIL"


def summary(outcomes: list[Outcome]) -> str:
    counts = {v: sum(verdict(o) == v for o in outcomes) for v in ("PASS", "FAIL", "SKIP")}
    return f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped"


def format_outcome(o: Outcome) -> str:
    measured = "  n/a " if o.measured is None else f"{o.measured:6.3f}"
    return f"{verdict(o)}  {o.contract_set}  {o.check:42s} {measured}  (needs {o.required}; {o.detail})"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")) / "docs" / "performance-contract.json"
    parser.add_argument("--contract", type=Path, default=default)
    parser.add_argument("--results", type=Path, required=True)
    args = parser.parse_args(argv)
    outcomes = evaluate(json.loads(args.contract.read_text()), json.loads(args.results.read_text()))
    for o in outcomes:
        print(format_outcome(o))
    print(summary(outcomes))
    return 1 if any(verdict(o) == "FAIL" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
