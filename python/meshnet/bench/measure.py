"""Figures of one benchmark cell from per-token timestamps, and process memory.

A cell is one (prompt length, concurrency) workload on one lane: `concurrency` streams start
together, each with its own prompt, and each records the monotonic time of every token it
receives. Definitions, the same for every lane that yields timestamps:
  ttft_ms          median over streams of (first token - start)
  prefill_tok_s    all prompt tokens / (latest first token - start)
  decode_tok_s     median over streams of (tokens - 1) / (last token - first token)
  aggregate_tok_s  tokens received while every stream was decoding / that window's length
                   (from the latest first token to the earliest last token): the steady
                   concurrent decode rate, comparable to llama-batched-bench's S_TG
  itl_p50/p95_ms   percentiles of the gaps between consecutive tokens, all streams pooled
"""

from __future__ import annotations

import bisect
import statistics
import time
from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:
    from meshnet.bench.schema import Cell, Lane


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def find_cell(lane: "Lane", prompt: int, concurrency: int) -> "Cell":
    """The lane's cell for (prompt tokens, concurrency), or {} when it did not run."""
    for cell in lane.get("cells") or []:
        if cell.get("prompt_tokens") == prompt and cell.get("concurrency") == concurrency:
            return cell
    return {}


def cell_figures(start: float, streams: Sequence[Sequence[float]], prompt_tokens: int) -> dict:
    """Figures of one cell: `streams` holds each stream's token arrival times (seconds, same
    clock as `start`); streams that produced nothing count as failures elsewhere."""
    live = [s for s in streams if s]
    if not live:
        return {}
    firsts = [s[0] for s in live]
    lasts = [s[-1] for s in live]
    gaps = [b - a for s in live for a, b in zip(s, s[1:])]
    decode = [(len(s) - 1) / (s[-1] - s[0]) for s in live if len(s) > 1 and s[-1] > s[0]]
    window_start, window_end = max(firsts), min(lasts)
    if window_end > window_start:
        # tokens strictly after the window opens and up to its end, over all streams
        inside = sum(bisect.bisect_right(s, window_end) - bisect.bisect_right(s, window_start) for s in live)
        aggregate = inside / (window_end - window_start)
    else:  # degenerate (a stream ended before another began decoding): whole-span rate
        total = sum(len(s) - 1 for s in live)
        aggregate = total / (max(lasts) - min(firsts)) if max(lasts) > min(firsts) else None
    return {
        "ttft_ms": statistics.median(f - start for f in firsts) * 1000,
        "prefill_tok_s": prompt_tokens * len(live) / (max(firsts) - start),
        "decode_tok_s": statistics.median(decode) if decode else None,
        "aggregate_tok_s": aggregate,
        "itl_p50_ms": _ms(percentile(gaps, 50)),
        "itl_p95_ms": _ms(percentile(gaps, 95)),
    }


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1000


def rounded(figures: dict, digits: int = 2) -> dict:
    return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in figures.items()}
