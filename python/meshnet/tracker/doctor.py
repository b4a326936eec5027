"""`bazel run //python:doctor -- --status http://127.0.0.1:7701/status.json`: why each node serves
what it does (issue 50, item 7), read from the tracker's read-only HTTP side (`--http-listen`).

For every node the tracker knows, one paragraph: what it serves now (model, layers, state,
routes, heartbeat), what it offered when it joined (the memory it measured or its cap, its free
disk, its device), what it was assigned and why, whether it is still fetching its part, and,
when it was not placed, the reason (out of memory or disk, nothing published). Pure but for the
one HTTP GET: `explain` turns /status.json into the lines printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Optional

from meshnet.tracker.assignment import human_bytes

MAX_STATUS_BYTES = 64 << 20


def _serving(node: dict) -> str:
    start, end = node["layers"]
    return (f"serves {node['model']} layers {start}-{end} ({node['state']}, {node['routes']} routes, "
            f"heartbeat {node['heartbeat_age_s']:.1f} s ago)")


def _joined(decision: dict, registered: bool) -> list[str]:
    lines = [f"offered {human_bytes(decision['memory_bytes'])} of memory and {human_bytes(decision['disk_free_bytes'])}"
             f" of disk on {decision['device'] or 'an unnamed device'}"]
    if decision["model"]:
        start, end = decision["layers"]
        lines.append(f"assigned {decision['model']} layers {start}-{end} ({decision['part']}): {decision['reason']}")
        if decision["fetching"] and not registered:
            lines.append("fetching its part (assigned, not registered yet)")
    else:
        lines.append(f"not placed: {decision['reason']}")
    return lines


def explain(status: dict) -> list[str]:
    """The doctor's lines for a /status.json document."""
    nodes = {n["node_id"]: n for n in status.get("nodes", [])}
    joining = {d["node_id"]: d for d in status.get("joining", [])}
    if not nodes and not joining:
        return ["no node has registered or asked to join"]
    out = []
    for node_id in sorted(set(nodes) | set(joining)):
        out.append(node_id)
        if node_id in nodes:
            out.append("  " + _serving(nodes[node_id]))
        if node_id in joining:
            out += ["  " + line for line in _joined(joining[node_id], node_id in nodes)]
        else:
            out.append("  placed by hand (--layers): it did not join through the tracker")
    for model in status.get("models", []):
        if model.get("gaps"):
            gaps = ", ".join(f"{a}-{b}" for a, b in model["gaps"])
            out.append(f"{model['model']}: layers {gaps} have no routable node")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Why each node serves what it does (the tracker's /status.json).")
    parser.add_argument("--status", required=True, metavar="URL",
                        help="the tracker's /status.json (its --http-listen), e.g. http://127.0.0.1:7701/status.json")
    args = parser.parse_args(argv)
    try:
        with urllib.request.urlopen(args.status, timeout=10) as reply:
            status = json.loads(reply.read(MAX_STATUS_BYTES + 1)[:MAX_STATUS_BYTES])
    except (urllib.error.URLError, OSError, ValueError) as err:
        print(f"doctor: cannot read {args.status}: {err}", file=sys.stderr)
        return 2
    print("\n".join(explain(status)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
