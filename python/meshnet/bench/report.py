"""Turns a benchmark results dict into a human report: out_dir/summary.md and out_dir/plots/*.png.

summary.md holds the run's header (command, host, model, settings), the performance contract outcomes,
a headline table per lane, per-lane cell tables (processes, nodes, notes), the drift table, the
runtime-only lanes, WAN notes, the lanes that did not run (with their reasons, never as zeros) and
links to the plots. Plots: aggregate_tok_s.png, ttft.png, itl.png, rss.png; a plot with no data is
not written. Missing values are rendered as "n/a".
"""

from __future__ import annotations

import math
import pathlib
import re
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402
from meshnet.bench import contract  # noqa: E402
from meshnet.bench.measure import find_cell  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
NA = "n/a"
DPI = 110
BASELINE_LANE = "llama_cpp_single_process"
SHORT_PROMPT = 128
LONG_PROMPT = 512
HIGH_CONCURRENCY = 8


# ---- values and formatting ----


def _number(value: Any) -> float | None:
    """The value as a float, or None when it is missing, not a number, a bool or NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if math.isnan(value):
        return None
    return float(value)


def _fmt(value: Any, digits: int = 1) -> str:
    number = _number(value)
    return NA if number is None else f"{number:.{digits}f}"


def _fmt_int(value: Any) -> str:
    number = _number(value)
    return NA if number is None else str(int(number))


def _mib(value: Any) -> float | None:
    number = _number(value)
    return None if number is None else number / MIB


def _text(value: Any) -> str:
    return NA if value is None or value == "" else str(value)


def _escape(text: str) -> str:
    """Keeps free text from breaking a markdown table row."""
    return text.replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_escape(cell) for cell in row) + " |")
    return lines


# ---- lanes and cells ----


def _lanes(group: dict | None) -> dict[str, dict]:
    if not isinstance(group, dict):
        return {}
    return group.get("lanes") or {}


def _available(lanes: dict[str, dict]) -> dict[str, dict]:
    return {name: lane for name, lane in lanes.items() if lane.get("available", True)}


def _unavailable(lanes: dict[str, dict]) -> dict[str, dict]:
    return {name: lane for name, lane in lanes.items() if not lane.get("available", True)}


def _label(name: str, lane: dict) -> str:
    return lane.get("label") or name


def _cells(lane: dict) -> list[dict]:
    return lane.get("cells") or []


def _metric(lane: dict, prompt: int, concurrency: int, key: str) -> float | None:
    return _number(find_cell(lane, prompt, concurrency).get(key))


def _process_rss_bytes(lane: dict) -> float | None:
    """Sum of the processes' peak RSS; the lane's own peak_rss_bytes when it lists no processes."""
    values = [_number(p.get("peak_rss_bytes")) for p in lane.get("processes") or []]
    values = [v for v in values if v is not None]
    if values:
        return sum(values)
    return _number(lane.get("peak_rss_bytes"))


# ---- summary sections ----


def _header(results: dict) -> list[str]:
    meta = results.get("meta") or {}
    host = meta.get("host") or {}
    model = meta.get("model") or {}
    memory = _number(host.get("memory_bytes"))
    memory_text = NA if memory is None else f"{memory / GIB:.1f} GiB"
    return [
        "# Meshnet benchmark report",
        "",
        f"- Command: `{_text(meta.get('command'))}`",
        f"- Started: {_text(meta.get('started'))}",
        f"- Duration: {_fmt(meta.get('duration_s'))} s",
        f"- Host: {_text(host.get('cpu'))}, {_fmt_int(host.get('cores'))} cores, {memory_text} memory, "
        f"kernel {_text(host.get('kernel'))}, Python {_text(host.get('python'))}",
        f"- Model: {_text(model.get('name'))} ({_text(model.get('type'))}, {_fmt(_mib(model.get('bytes')))} MiB) "
        f"at `{_text(model.get('path'))}`",
        f"- Threads: {_fmt_int(meta.get('threads'))}; new tokens: {_fmt_int(meta.get('new_tokens'))}; "
        f"prompts: {_list_text(meta.get('prompts'))}; concurrency: {_list_text(meta.get('concurrency'))}; "
        f"K: {_fmt_int(meta.get('k'))}",
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
        rows.append([f"{outcome.check} ({outcome.contract_set})", _fmt(outcome.measured, 3), outcome.required, result, _text(outcome.detail)])
    lines = ["## Performance contract", ""]
    lines += _table(["check", "measured ratio", "required", "result", "detail"], rows)
    lines += ["", contract.summary(outcomes), ""]
    return lines


def _headline(lanes: dict[str, dict], title: str) -> list[str]:
    available = _available(lanes)
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
    return lines + _table(headers, rows) + [""]


def _headline_row(name: str, lane: dict, baseline: dict | None) -> list[str]:
    decode = _metric(lane, SHORT_PROMPT, 1, "decode_tok_s")
    row = [
        _label(name, lane),
        _fmt(_metric(lane, SHORT_PROMPT, 1, "ttft_ms")),
        _fmt(_metric(lane, LONG_PROMPT, 1, "ttft_ms")),
        _fmt(decode),
        _fmt(_metric(lane, SHORT_PROMPT, HIGH_CONCURRENCY, "aggregate_tok_s")),
        _fmt(_mib(_process_rss_bytes(lane))),
    ]
    if baseline is not None:
        row.append(_fmt(_ratio(decode, _metric(baseline, SHORT_PROMPT, 1, "decode_tok_s")), 3))
    return row


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _tokens_matching(cell: dict) -> str:
    matching = _number(cell.get("tokens_matching_transformers"))
    total = _number(cell.get("new_tokens"))
    if matching is None:
        return NA
    return f"{int(matching)}/{NA if total is None else int(total)}"


def _field(key: str, digits: int) -> Callable[[dict], str]:
    return lambda cell: _fmt(cell.get(key), digits)


def _int_field(key: str) -> Callable[[dict], str]:
    return lambda cell: _fmt_int(cell.get(key))


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
    return _table(headers, rows) + [""]


def _process_table(processes: list[dict]) -> list[str]:
    rows = [[_text(p.get("role")), _fmt(_mib(p.get("peak_rss_bytes")))] for p in processes]
    return ["Processes:", ""] + _table(["role", "peak RSS MiB"], rows) + [""]


def _layers_text(layers: Any) -> str:
    if not layers:
        return NA
    return "-".join(str(layer) for layer in layers)


def _budget_mib(node: dict, budget: dict | None) -> float | None:
    weights = _mib(node.get("weight_bytes"))
    kv = _mib(node.get("kv_bytes"))
    if weights is None or kv is None or not budget:
        return None
    return budget["ratio"] * (weights + kv) + budget["slack_mib"]


def _node_table(nodes: list[dict], budget: dict | None) -> list[str]:
    """`budget`: the contract's per-node RSS rule ({"ratio", "slack_mib"}), as the bench read it."""
    headers = ["node", "layers", "peak RSS MiB", "weights MiB", "KV MiB", "budget MiB"]
    rows = []
    for node in nodes:
        rows.append([
            _text(node.get("node")),
            _layers_text(node.get("layers")),
            _fmt(_mib(node.get("peak_rss_bytes"))),
            _fmt(_mib(node.get("weight_bytes"))),
            _fmt(_mib(node.get("kv_bytes"))),
            _fmt(_budget_mib(node, budget)),
        ])
    rule = (f"budget = {budget['ratio']} x (weights + KV) + {budget['slack_mib']} MiB, from the contract"
            if budget else "no budget: the contract names no per-node RSS check")
    return [f"Nodes ({rule}):", ""] + _table(headers, rows) + [""]


def _sides_table(lane: dict) -> list[str]:
    """A lane that compares two paths on one swarm (the gateway lane): each side's figures, the
    difference, and the concurrent run."""
    sides = [(side, lane[side]) for side in ("direct", "gateway") if isinstance(lane.get(side), dict)]
    rows = [[side, _fmt(f.get("ttft_ms")), _fmt(f.get("itl_p50_ms")), _fmt(f.get("itl_p95_ms")),
             _text(f.get("runs"))] for side, f in sides]
    lines = _table(["path", "TTFT ms (median)", "ITL p50 ms", "ITL p95 ms", "runs"], rows) + [""]
    figures = lane.get("figures") or {}
    lines += _table(["figure", "value"], [[k, _fmt(v, 2)] for k, v in figures.items()]) + [""]
    concurrent = lane.get("concurrent") or {}
    if concurrent.get("errors"):
        lines += ["Concurrent stream errors:", ""] + [f"- {_text(e)}" for e in concurrent["errors"]] + [""]
    return lines


def _lane_detail(name: str, lane: dict, budget: dict | None) -> list[str]:
    lines = [f"### {_label(name, lane)} (`{name}`)", ""]
    if any(isinstance(lane.get(side), dict) for side in ("direct", "gateway")):
        lines += _sides_table(lane)
    else:
        lines += _cell_table(_cells(lane))
        figures = lane.get("figures") or {}
        if figures:
            lines += _table(["lane figure", "value"], [[k, _fmt(v, 2)] for k, v in figures.items()]) + [""]
    if lane.get("processes"):
        lines += _process_table(lane["processes"])
    if lane.get("nodes"):
        lines += _node_table(lane["nodes"], budget)
    notes = lane.get("notes") or []
    if notes:
        lines += ["Notes:", ""] + [f"- {note}" for note in notes] + [""]
    return lines


def _details(lanes: dict[str, dict], budget: dict | None) -> list[str]:
    available = _available(lanes)
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
            _fmt(figures.get("top1_agreement"), 4),
            _fmt(figures.get("mean_kl"), 4),
            _fmt(figures.get("max_kl"), 4),
            _fmt_int(figures.get("positions")),
        ])
    headers = ["kind", "top-1 agreement", "mean KL", "max KL", "positions"]
    return ["## Drift", ""] + _table(headers, rows) + [""]


def _wan(wan: dict | None) -> list[str]:
    if not wan:
        return []
    applied = wan.get("applied") or {}
    lines = ["## WAN", ""]
    lines.append(f"Applied: delay {_fmt(applied.get('delay_ms'))} ms, rate {_fmt(applied.get('rate_mbit'))} Mbit/s")
    lines.append("")
    notes = wan.get("notes") or []
    if notes:
        lines += [f"- {note}" for note in notes] + [""]
    return lines


def _not_run(groups: list[tuple[str, dict[str, dict]]]) -> list[str]:
    items = []
    for group, lanes in groups:
        for name, lane in _unavailable(lanes).items():
            reason = lane.get("reason") or "no reason given"
            items.append(f"- {_label(name, lane)} (`{name}`, {group}): {reason}")
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
    lanes = _lanes(results)
    runtime_lanes = _lanes(results.get("runtime_only"))
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


# ---- plots ----


def _save(fig: plt.Figure, plots_dir: pathlib.Path, name: str) -> pathlib.Path:
    plots_dir.mkdir(parents=True, exist_ok=True)
    path = plots_dir / name
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _save_lines(fig: plt.Figure, ax: plt.Axes, plots_dir: pathlib.Path, name: str, xlabel: str, ylabel: str,
                title: str) -> pathlib.Path:
    """Labels, grid and legend of a line plot, then saves it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, plots_dir, name)


def _prompts(lane: dict) -> list[int]:
    return sorted({cell["prompt_tokens"] for cell in _cells(lane) if cell.get("prompt_tokens") is not None})


def _aggregate_series(lanes: dict[str, dict]) -> list[tuple[str, list[int], list[float]]]:
    """(legend label, concurrency values, aggregate tok/s) per lane and prompt."""
    series = []
    for name, lane in _available(lanes).items():
        for prompt in _prompts(lane):
            points = []
            for cell in _cells(lane):
                value = _number(cell.get("aggregate_tok_s"))
                if cell.get("prompt_tokens") == prompt and value is not None and cell.get("concurrency"):
                    points.append((int(cell["concurrency"]), value))
            if points:
                points.sort()
                label = f"{_label(name, lane)}, prompt {prompt}"
                series.append((label, [p[0] for p in points], [p[1] for p in points]))
    return series


def _plot_aggregate(lanes: dict[str, dict], plots_dir: pathlib.Path) -> pathlib.Path | None:
    series = _aggregate_series(lanes)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ticks = set()
    for label, concurrency, values in series:
        ax.plot(concurrency, values, marker="o", label=label)
        ticks.update(concurrency)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks))
    ax.set_xticklabels([str(t) for t in sorted(ticks)])
    ax.xaxis.set_minor_locator(NullLocator())
    return _save_lines(fig, ax, plots_dir, "aggregate_tok_s.png", "concurrent sessions", "aggregate tok/s",
                       "Aggregate decode throughput vs concurrency")


def _grouped_bars(ax: plt.Axes, labels: list[str], groups: dict[str, list[float | None]]) -> None:
    """One bar per (label, group); a missing value draws no bar."""
    positions = np.arange(len(labels))
    width = 0.8 / max(len(groups), 1)
    for index, (group, values) in enumerate(groups.items()):
        offset = (index - (len(groups) - 1) / 2) * width
        xs = [positions[i] + offset for i, v in enumerate(values) if v is not None]
        ys = [v for v in values if v is not None]
        ax.bar(xs, ys, width=width, label=group)
    ax.set_xticks(positions)
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=9)


def _plot_ttft(lanes: dict[str, dict], plots_dir: pathlib.Path) -> pathlib.Path | None:
    labels = []
    rows = []
    for name, lane in _available(lanes).items():
        values = {prompt: _metric(lane, prompt, 1, "ttft_ms") for prompt in _prompts(lane)}
        values = {prompt: value for prompt, value in values.items() if value is not None and value > 0}
        if values:
            labels.append(_label(name, lane))
            rows.append(values)
    if not rows:
        return None
    prompts = sorted({prompt for values in rows for prompt in values})
    groups = {f"prompt {prompt}": [values.get(prompt) for values in rows] for prompt in prompts}
    fig, ax = plt.subplots(figsize=(9, 5.5))
    _grouped_bars(ax, labels, groups)
    ax.set_yscale("log")
    ax.set_ylim(bottom=min(value for values in rows for value in values.values()) / 2)
    ax.set_ylabel("TTFT ms (log scale)")
    ax.set_title("Time to first token at concurrency 1")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9)
    return _save(fig, plots_dir, "ttft.png")


def _plot_itl(lanes: dict[str, dict], plots_dir: pathlib.Path) -> pathlib.Path | None:
    labels = []
    p50 = []
    p95 = []
    for name, lane in _available(lanes).items():
        low = _metric(lane, SHORT_PROMPT, 1, "itl_p50_ms")
        high = _metric(lane, SHORT_PROMPT, 1, "itl_p95_ms")
        if low is None and high is None:
            continue
        labels.append(_label(name, lane))
        p50.append(low)
        p95.append(high)
    if not labels:
        return None
    fig, ax = plt.subplots(figsize=(9, 5.5))
    _grouped_bars(ax, labels, {"p50": p50, "p95": p95})
    ax.set_ylabel("inter-token latency ms")
    ax.set_title(f"Inter-token latency at concurrency 1, prompt {SHORT_PROMPT}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9)
    return _save(fig, plots_dir, "itl.png")


WAN_LANE = re.compile(r"^wan_(\d+)ms_(.+)$")


def _plot_wan(lanes: dict[str, dict], plots_dir: pathlib.Path) -> pathlib.Path | None:
    """Single-stream decode tok/s against the one-way delay per link, one line per kind of
    wan_<d>ms_<kind> lane (GGUF ring, llama.cpp RPC, client-driven, with speculation)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for name, lane in _available(lanes).items():
        match = WAN_LANE.match(name)
        if not match:
            continue
        value = _number((lane.get("figures") or {}).get("decode_tok_s"))
        if value is None:
            value = _metric(lane, _prompts(lane)[0], 1, "decode_tok_s") if _prompts(lane) else None
        if value is not None:
            series.setdefault(match.group(2), []).append((int(match.group(1)), value))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for kind, points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=kind)
    return _save_lines(fig, ax, plots_dir, "wan.png", "one-way delay per link, ms (delay proxy)",
                       "decode tok/s, one stream", "Decode speed vs link delay")


def _plot_rss(lanes: dict[str, dict], plots_dir: pathlib.Path) -> pathlib.Path | None:
    labels = []
    values = []
    for name, lane in _available(lanes).items():
        for process in lane.get("processes") or []:
            rss = _mib(process.get("peak_rss_bytes"))
            if rss is not None:
                labels.append(f"{_label(name, lane)}: {_text(process.get('role'))}")
                values.append(rss)
    if not labels:
        return None
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.35 * len(labels)))
    positions = np.arange(len(labels))
    ax.barh(positions, values)
    ax.set_yticks(positions)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("peak RSS MiB")
    ax.set_title("Peak RSS per process")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, plots_dir, "rss.png")


def _plots(lanes: dict[str, dict], plots_dir: pathlib.Path) -> list[pathlib.Path]:
    written = [
        _plot_aggregate(lanes, plots_dir),
        _plot_ttft(lanes, plots_dir),
        _plot_itl(lanes, plots_dir),
        _plot_rss(lanes, plots_dir),
        _plot_wan(lanes, plots_dir),
    ]
    return [path for path in written if path is not None]


def write_report(results: dict, out_dir: pathlib.Path, contract_outcomes: list | None = None) -> list[pathlib.Path]:
    """Writes out_dir/summary.md and out_dir/plots/*.png; returns the paths written."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = _plots(_lanes(results), out_dir / "plots")
    summary = out_dir / "summary.md"
    summary.write_text(_summary(results, contract_outcomes, plots) + "\n", encoding="utf-8")
    return [summary] + plots
