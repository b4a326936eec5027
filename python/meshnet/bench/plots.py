"""The bench report's plots (out_dir/plots/*.png): aggregate tok/s against concurrency, TTFT,
ITL, peak RSS per process, and decode tok/s against link delay for the WAN lanes. A plot with
no data is not written."""

from __future__ import annotations

import pathlib
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from meshnet.bench.report_format import (SHORT_PROMPT, as_number, available_lanes, cells, lane_label,  # noqa: E402
                                         metric, mib, text)

DPI = 110

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
    return sorted({cell["prompt_tokens"] for cell in cells(lane) if cell.get("prompt_tokens") is not None})


def _aggregate_series(lanes: dict[str, dict]) -> list[tuple[str, list[int], list[float]]]:
    """(legend label, concurrency values, aggregate tok/s) per lane and prompt."""
    series = []
    for name, lane in available_lanes(lanes).items():
        for prompt in _prompts(lane):
            points = []
            for cell in cells(lane):
                value = as_number(cell.get("aggregate_tok_s"))
                if cell.get("prompt_tokens") == prompt and value is not None and cell.get("concurrency"):
                    points.append((int(cell["concurrency"]), value))
            if points:
                points.sort()
                label = f"{lane_label(name, lane)}, prompt {prompt}"
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
    for name, lane in available_lanes(lanes).items():
        values = {prompt: metric(lane, prompt, 1, "ttft_ms") for prompt in _prompts(lane)}
        values = {prompt: value for prompt, value in values.items() if value is not None and value > 0}
        if values:
            labels.append(lane_label(name, lane))
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
    for name, lane in available_lanes(lanes).items():
        low = metric(lane, SHORT_PROMPT, 1, "itl_p50_ms")
        high = metric(lane, SHORT_PROMPT, 1, "itl_p95_ms")
        if low is None and high is None:
            continue
        labels.append(lane_label(name, lane))
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
    for name, lane in available_lanes(lanes).items():
        match = WAN_LANE.match(name)
        if not match:
            continue
        value = as_number((lane.get("figures") or {}).get("decode_tok_s"))
        if value is None:
            value = metric(lane, _prompts(lane)[0], 1, "decode_tok_s") if _prompts(lane) else None
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
    for name, lane in available_lanes(lanes).items():
        for process in lane.get("processes") or []:
            rss = mib(process.get("peak_rss_bytes"))
            if rss is not None:
                labels.append(f"{lane_label(name, lane)}: {text(process.get('role'))}")
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


def write_plots(lanes: dict[str, dict], plots_dir: pathlib.Path) -> list[pathlib.Path]:
    written = [
        _plot_aggregate(lanes, plots_dir),
        _plot_ttft(lanes, plots_dir),
        _plot_itl(lanes, plots_dir),
        _plot_rss(lanes, plots_dir),
        _plot_wan(lanes, plots_dir),
    ]
    return [path for path in written if path is not None]
