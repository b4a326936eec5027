"""Turns a benchmark results dict into a human report: out_dir/summary.md and out_dir/plots/*.png.

summary.md holds the run's header (command, host, model, settings), the performance contract outcomes,
a headline table per lane, per-lane cell tables (processes, nodes, notes), the drift table, the
runtime-only lanes, WAN notes, the lanes that did not run (with their reasons, never as zeros) and
links to the plots. Plots: aggregate_tok_s.png, ttft.png, itl.png, rss.png; a plot with no data is
not written. Missing values are rendered as "n/a".
"""
from __future__ import annotations

import pathlib
from typing import Any, Callable

from meshnet.bench import contract
from meshnet.bench.plots import write_plots
from meshnet.bench.report_format import (GIB, NA, SHORT_PROMPT, as_number, available_lanes, cells, fmt, fmt_int,
                                         lane_group, lane_label, metric, mib, process_rss_bytes, table, text,
                                         unavailable_lanes)

BASELINE_LANE = "llama_cpp_single_process"
LONG_PROMPT = 512
HIGH_CONCURRENCY = 8


# ---- summary sections ----


def _header(results: dict) -> list[str]:
    meta = results.get("meta") or {}
    host = meta.get("host") or {}
    model = meta.get("model") or {}
    memory = as_number(host.get("memory_bytes"))
    memory_text = NA if memory is None else f"{memory / GIB:.1f} GiB"
    return [
        "# Meshnet benchmark report",
        "",
        f"- Command: `{text(meta.get('command'))}`",
        f"- Started: {text(meta.get('started'))}",
        f"- Duration: {fmt(meta.get('duration_s'))} s",
        f"- Host: {text(host.get('cpu'))}, {fmt_int(host.get('cores'))} cores, {memory_text} memory, "
        f"kernel {text(host.get('kernel'))}, Python {text(host.get('python'))}",
        f"- Model: {text(model.get('name'))} ({text(model.get('type'))}, {fmt(mib(model.get('bytes')))} MiB) "
        f"at `{text(model.get('path'))}`",
        f"- Threads: {fmt_int(meta.get('threads'))}; new tokens: {fmt_int(meta.get('new_tokens'))}; "
        f"prompts: {_list_text(meta.get('prompts'))}; concurrency: {_list_text(meta.get('concurrency'))}; "
        f"K: {fmt_int(meta.get('k'))}",
        "",
    ]


def _list_text(values: Any) -> str:
    if not values:
        return NA
    return ", ".join(str(v) for v in values)


def _contract(outcomes: list) -> list[str]:
    rows = []
    for outcome in outcomes:
        result = contract.verdict(outcome)
        rows.append([f"{outcome.check} ({outcome.contract_set})", fmt(outcome.measured, 3), outcome.required, result, text(outcome.detail)])
    lines = ["## Performance contract", ""]
    lines += table(["check", "measured ratio", "required", "result", "detail"], rows)
    lines += ["", contract.summary(outcomes), ""]
    return lines


def _headline(lanes: dict[str, dict], title: str) -> list[str]:
    available = available_lanes(lanes)
    lines = [f"## {title}", ""]
    if not available:
        return lines + ["No lanes ran.", ""]
    baseline = available.get(BASELINE_LANE)
    headers = [
        "lane",
        f"TTFT ms (prompt {SHORT_PROMPT}, c=1)",
        f"TTFT ms (prompt {LONG_PROMPT}, c=1)",
        f"decode tok/s ({SHORT_PROMPT}, c=1)",
        f"aggregate tok/s at c={HIGH_CONCURRENCY} (prompt {SHORT_PROMPT})",
        "peak RSS MiB (sum of processes)",
    ]
    if baseline is not None:
        headers.append("decode vs llama.cpp")
    rows = [_headline_row(name, lane, baseline) for name, lane in available.items()]
    return lines + table(headers, rows) + [""]


def _headline_row(name: str, lane: dict, baseline: dict | None) -> list[str]:
    decode = metric(lane, SHORT_PROMPT, 1, "decode_tok_s")
    row = [
        lane_label(name, lane),
        fmt(metric(lane, SHORT_PROMPT, 1, "ttft_ms")),
        fmt(metric(lane, LONG_PROMPT, 1, "ttft_ms")),
        fmt(decode),
        fmt(metric(lane, SHORT_PROMPT, HIGH_CONCURRENCY, "aggregate_tok_s")),
        fmt(mib(process_rss_bytes(lane))),
    ]
    if baseline is not None:
        row.append(fmt(_ratio(decode, metric(baseline, SHORT_PROMPT, 1, "decode_tok_s")), 3))
    return row


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _tokens_matching(cell: dict) -> str:
    matching = as_number(cell.get("tokens_matching_transformers"))
    total = as_number(cell.get("new_tokens"))
    if matching is None:
        return NA
    return f"{int(matching)}/{NA if total is None else int(total)}"


def _field(key: str, digits: int) -> Callable[[dict], str]:
    return lambda cell: fmt(cell.get(key), digits)


def _int_field(key: str) -> Callable[[dict], str]:
    return lambda cell: fmt_int(cell.get(key))


CELL_COLUMNS: list[tuple[str, Callable[[dict], str]]] = [
    ("prompt", _int_field("prompt_tokens")),
    ("c", _int_field("concurrency")),
    ("TTFT ms", _field("ttft_ms", 1)),
    ("prefill tok/s", _field("prefill_tok_s", 1)),
    ("decode tok/s", _field("decode_tok_s", 1)),
    ("aggregate tok/s", _field("aggregate_tok_s", 1)),
    ("ITL p50 ms", _field("itl_p50_ms", 2)),
    ("ITL p95 ms", _field("itl_p95_ms", 2)),
    ("seam B/token", _field("seam_bytes_per_token", 0)),
    ("seam overhead ms", _field("seam_overhead_ms", 2)),
    ("decode compute ms/token", _field("decode_compute_ms_per_token", 2)),
    ("model ITL ms", _field("model_itl_ms", 2)),
    ("ITL p50 - model ms", _field("itl_p50_over_model_ms", 2)),
    ("drafted", _int_field("drafted_tokens")),
    ("accepted", _int_field("accepted_drafts")),
    ("batch rows", _field("mean_batch_rows", 2)),
    ("max batch sessions", _int_field("max_batch_sessions")),
    ("max queue", _int_field("max_queue_depth")),
    ("failures", _int_field("failures")),
    ("tokens = Transformers", _tokens_matching),
]


def _cell_table(cells: list[dict]) -> list[str]:
    """All cells of a lane; a column that is n/a in every cell is left out."""
    columns = []
    for header, render in CELL_COLUMNS:
        values = [render(cell) for cell in cells]
        if any(value != NA for value in values):
            columns.append((header, values))
    if not columns:
        return ["No cells recorded.", ""]
    headers = [header for header, _ in columns]
    rows = [[values[i] for _, values in columns] for i in range(len(cells))]
    return table(headers, rows) + [""]


def _process_table(processes: list[dict]) -> list[str]:
    rows = [[text(p.get("role")), fmt(mib(p.get("peak_rss_bytes")))] for p in processes]
    return ["Processes:", ""] + table(["role", "peak RSS MiB"], rows) + [""]


def _layers_text(layers: Any) -> str:
    if not layers:
        return NA
    return "-".join(str(layer) for layer in layers)


def _budget_mib(node: dict, budget: dict | None) -> float | None:
    weights = mib(node.get("weight_bytes"))
    kv = mib(node.get("kv_bytes"))
    if weights is None or kv is None or not budget:
        return None
    return budget["ratio"] * (weights + kv) + budget["slack_mib"]


def _node_table(nodes: list[dict], budget: dict | None) -> list[str]:
    """`budget`: the contract's per-node RSS rule ({"ratio", "slack_mib"}), as the bench read it."""
    headers = ["node", "layers", "peak RSS MiB", "weights MiB", "KV MiB", "budget MiB"]
    rows = []
    for node in nodes:
        rows.append([
            text(node.get("node")),
            _layers_text(node.get("layers")),
            fmt(mib(node.get("peak_rss_bytes"))),
            fmt(mib(node.get("weight_bytes"))),
            fmt(mib(node.get("kv_bytes"))),
            fmt(_budget_mib(node, budget)),
        ])
    rule = (f"budget = {budget['ratio']} x (weights + KV) + {budget['slack_mib']} MiB, from the contract"
            if budget else "no budget: the contract names no per-node RSS check")
    return [f"Nodes ({rule}):", ""] + table(headers, rows) + [""]


def _sides_table(lane: dict) -> list[str]:
    """A lane that compares two paths on one swarm (the gateway lane): each side's figures, the
    difference, and the concurrent run."""
    sides = [(side, lane[side]) for side in ("direct", "gateway") if isinstance(lane.get(side), dict)]
    rows = [[side, fmt(f.get("ttft_ms")), fmt(f.get("itl_p50_ms")), fmt(f.get("itl_p95_ms")),
             text(f.get("runs"))] for side, f in sides]
    lines = table(["path", "TTFT ms (median)", "ITL p50 ms", "ITL p95 ms", "runs"], rows) + [""]
    figures = lane.get("figures") or {}
    lines += table(["figure", "value"], [[k, fmt(v, 2)] for k, v in figures.items()]) + [""]
    concurrent = lane.get("concurrent") or {}
    if concurrent.get("errors"):
        lines += ["Concurrent stream errors:", ""] + [f"- {text(e)}" for e in concurrent["errors"]] + [""]
    return lines


def _lane_detail(name: str, lane: dict, budget: dict | None) -> list[str]:
    lines = [f"### {lane_label(name, lane)} (`{name}`)", ""]
    if any(isinstance(lane.get(side), dict) for side in ("direct", "gateway")):
        lines += _sides_table(lane)
    else:
        lines += _cell_table(cells(lane))
        figures = lane.get("figures") or {}
        if figures:
            lines += table(["lane figure", "value"], [[k, fmt(v, 2)] for k, v in figures.items()]) + [""]
    if lane.get("processes"):
        lines += _process_table(lane["processes"])
    if lane.get("nodes"):
        lines += _node_table(lane["nodes"], budget)
    notes = lane.get("notes") or []
    if notes:
        lines += ["Notes:", ""] + [f"- {note}" for note in notes] + [""]
    return lines


def _details(lanes: dict[str, dict], budget: dict | None) -> list[str]:
    available = available_lanes(lanes)
    if not available:
        return []
    lines = ["## Per-lane detail", ""]
    for name, lane in available.items():
        lines += _lane_detail(name, lane, budget)
    return lines


def _drift(drift: dict | None) -> list[str]:
    if not drift:
        return []
    rows = []
    for kind, figures in drift.items():
        figures = figures or {}
        rows.append([
            kind,
            fmt(figures.get("top1_agreement"), 4),
            fmt(figures.get("mean_kl"), 4),
            fmt(figures.get("max_kl"), 4),
            fmt_int(figures.get("positions")),
        ])
    headers = ["kind", "top-1 agreement", "mean KL", "max KL", "positions"]
    return ["## Drift", ""] + table(headers, rows) + [""]


def _wan(wan: dict | None) -> list[str]:
    if not wan:
        return []
    applied = wan.get("applied") or {}
    lines = ["## WAN", ""]
    lines.append(f"Applied: delay {fmt(applied.get('delay_ms'))} ms, rate {fmt(applied.get('rate_mbit'))} Mbit/s")
    lines.append("")
    notes = wan.get("notes") or []
    if notes:
        lines += [f"- {note}" for note in notes] + [""]
    return lines


def _not_run(groups: list[tuple[str, dict[str, dict]]]) -> list[str]:
    items = []
    for group, lanes in groups:
        for name, lane in unavailable_lanes(lanes).items():
            reason = lane.get("reason") or "no reason given"
            items.append(f"- {lane_label(name, lane)} (`{name}`, {group}): {reason}")
    if not items:
        return []
    return ["## Lanes not run", ""] + items + [""]


def _plot_links(plots: list[pathlib.Path]) -> list[str]:
    lines = ["## Plots", ""]
    if not plots:
        return lines + ["No plots (no data).", ""]
    for path in plots:
        lines += [f"![{path.stem}](plots/{path.name})", ""]
    return lines


def _summary(results: dict, contract_outcomes: list | None, plots: list[pathlib.Path]) -> str:
    lanes = lane_group(results)
    runtime_lanes = lane_group(results.get("runtime_only"))
    lines = _header(results)
    if contract_outcomes is not None:
        lines += _contract(contract_outcomes)
    lines += _headline(lanes, "Headline")
    budget = (results.get("meta") or {}).get("node_budget")
    lines += _details(lanes, budget)
    lines += _drift(results.get("drift"))
    if runtime_lanes:
        lines += _headline(runtime_lanes, "Runtime only")
        lines += _details(runtime_lanes, budget)
    lines += _wan(results.get("wan"))
    lines += _not_run([("lanes", lanes), ("runtime only", runtime_lanes)])
    lines += _plot_links(plots)
    return "\n".join(lines)


def write_report(results: dict, out_dir: pathlib.Path, contract_outcomes: list | None = None) -> list[pathlib.Path]:
    """Writes out_dir/summary.md and out_dir/plots/*.png; returns the paths written."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(lane_group(results), out_dir / "plots")
    summary = out_dir / "summary.md"
    summary.write_text(_summary(results, contract_outcomes, plots) + "\n", encoding="utf-8")
    return [summary] + plots
