"""The tracker's swarm status page: one self-refreshing HTML page from a registry snapshot and
the ledger's totals (served by tracker/web/web.py at /status).

It shows a coverage map per certified model (a row of replica counts per layer, gaps in red,
and one row per node showing the layers it serves, coloured by state), the node table (range,
state, load, measured tok/s, last heartbeat), the live routes and the ledger totals per node and
per client. Pure: `render` only formats what it is given. Invariants: every value is escaped
(jinja2 autoescape: node ids, addresses, model names and client ids come from strangers), and
the page's size is bounded: at most MAX_COLUMNS columns per map (wider models group layers) and
the snapshot's own bounds on nodes and routes.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Sequence

import jinja2

from meshnet.tracker.metrics import LedgerView
from meshnet.tracker.snapshot import ModelView, NodeView, RegistrySnapshot

MAX_COLUMNS = 120  # coverage map columns; a wider model shows groups of layers per column
REFRESH_SECONDS = 2


@dataclasses.dataclass(frozen=True)
class Column:
    start: int  # layers [start, end) of the model in this column
    end: int
    replicas: int  # the fewest routable nodes on any of them (0: part of a gap)

    @property
    def label(self) -> str:
        return str(self.start) if self.end - self.start == 1 else f"{self.start}-{self.end - 1}"


@dataclasses.dataclass(frozen=True)
class MapRow:
    node: NodeView
    served: tuple[bool, ...]  # per column: the node serves a layer of it


@dataclasses.dataclass(frozen=True)
class CoverageMap:
    model: ModelView
    columns: tuple[Column, ...]
    rows: tuple[MapRow, ...]


def coverage_map(model: ModelView, nodes: Sequence[NodeView], max_columns: int = MAX_COLUMNS) -> CoverageMap:
    width = max(1, math.ceil(model.n_layer / max_columns))
    columns = tuple(Column(s, min(model.n_layer, s + width), min(model.replicas[s:s + width]))
                    for s in range(0, model.n_layer, width))
    rows = tuple(MapRow(n, tuple(n.layers[0] < c.end and c.start < n.layers[1] for c in columns))
                 for n in nodes if n.model == model.model)
    return CoverageMap(model, columns, rows)


def _ranges(gaps: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"{s}..{e - 1}" if e - s > 1 else str(s) for s, e in gaps)


def _age(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{ refresh }}">
<title>Meshnet swarm status</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .4em 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
td { white-space: nowrap; } td.hops { white-space: normal; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 12px; }
table.map td, table.map th { padding: 0; border: 1px solid #fff; min-width: 14px; height: 18px;
  text-align: center; font-size: 10px; }
table.map th.node { text-align: right; padding: 0 6px; font-weight: normal; white-space: nowrap; }
td.cell.covered { background: #9fd89f; } td.cell.gap { background: #e53935; color: #fff; }
td.cell.routable { background: #2e7d32; } td.cell.draining { background: #f9a825; }
td.cell.banned { background: #6d4c41; } td.cell.dark { background: #9e9e9e; } td.cell.idle { background: #f3f3f3; }
.state-routable { color: #2e7d32; } .state-draining { color: #f9a825; } .state-banned { color: #6d4c41; }
.state-dark { color: #757575; } .gaps { color: #e53935; font-weight: bold; } .muted { color: #777; }
</style>
</head>
<body>
<h1>Meshnet swarm</h1>
<p class="muted">{{ node_count }} live node(s), {{ route_count }} live route(s); generated {{ generated }};
refreshes every {{ refresh }} s. Read-only.</p>

<h2>Coverage</h2>
{% for map in maps %}
<section class="coverage" data-model="{{ map.model.model }}">
<h3>{{ map.model.model }} <span class="muted">({{ map.model.n_layer }} layers,
{{ "%.0f"|format(map.model.covered_ratio * 100) }}% covered)</span></h3>
{% if map.model.gaps %}<p class="gaps">Gaps: layers {{ gaps(map.model.gaps) }}</p>{% endif %}
<table class="map">
<tr><th class="node">layer</th>
{%- for c in map.columns %}<th title="layers {{ c.label }}">{{ c.start }}</th>{% endfor %}</tr>
<tr class="replicas"><th class="node">replicas</th>
{%- for c in map.columns %}<td class="cell {{ 'gap' if c.replicas == 0 else 'covered' }}" data-layers="{{ c.label }}"
 title="layers {{ c.label }}: {{ c.replicas }} routable">{{ c.replicas }}</td>{% endfor %}</tr>
{% for row in map.rows %}<tr class="node-row" data-node="{{ row.node.node_id }}">
<th class="node"><code>{{ row.node.node_id }}</code></th>
{%- for served in row.served %}<td class="cell {{ row.node.state if served else 'idle' }}"></td>{% endfor %}</tr>
{% endfor %}</table>
</section>
{% else %}<p class="muted">No certified models.</p>
{% endfor %}

<h2>Nodes</h2>
<table id="nodes">
<tr><th>node</th><th>address</th><th>model</th><th>backend</th><th>layers</th><th>state</th><th>sessions</th>
<th>routes</th><th>queue</th><th>KV cells</th><th>batch occupancy</th><th>decode tok/s</th><th>last heartbeat</th></tr>
{% for n in nodes %}<tr data-node="{{ n.node_id }}"><td><code>{{ n.node_id }}</code></td><td>{{ n.address }}</td>
<td>{{ n.model }}</td><td>{{ n.backend }}</td><td>[{{ n.layers[0] }}, {{ n.layers[1] }})</td>
<td class="state-{{ n.state }}">{{ n.state }}</td><td class="num">{{ n.load.active_sessions }}</td>
<td class="num">{{ n.routes }}</td><td class="num">{{ n.load.queue_depth }}</td>
<td class="num">{{ n.load.kv_cells_used }} / {{ n.load.kv_cells_total }}</td>
<td class="num">{{ "%.2f"|format(n.load.batch_occupancy) }}</td>
<td class="num">{{ "%.1f"|format(n.load.decode_tokens_per_second) }}</td>
<td class="num">{{ age(n.heartbeat_age_s) }} ago</td></tr>
{% endfor %}</table>
{% if node_count > nodes|length %}<p class="muted">and {{ node_count - nodes|length }} more.</p>{% endif %}

<h2>Live routes</h2>
<table id="routes">
<tr><th>route</th><th>model</th><th>epoch</th><th>client</th><th>hops</th><th>age</th><th>lease left</th></tr>
{% for r in routes %}<tr><td><code>{{ r.tag }}</code></td><td>{{ r.model }}</td><td class="num">{{ r.epoch }}</td>
<td>{{ r.client_id }}</td><td class="hops">
{%- for node, start, end in r.hops %}<code>{{ node }}</code> [{{ start }}, {{ end }})
{%- if not loop.last %} &rarr; {% endif %}
{%- else %}<span class="muted">none (waiting for a route)</span>{% endfor %}</td>
<td class="num">{{ age(r.age_s) }}</td><td class="num">{{ age(r.lease_left_s) }}</td></tr>
{% else %}<tr><td colspan="7" class="muted">none</td></tr>
{% endfor %}</table>
{% if route_count > routes|length %}<p class="muted">and {{ route_count - routes|length }} more.</p>{% endif %}

<h2>Ledger</h2>
{% if ledger_unavailable %}<p id="ledger-unavailable"><strong>The ledger cannot be read now:</strong>
{{ ledger_unavailable }}. The totals below are the last ones read.</p>{% endif %}
<p>{{ ledger_sessions }} route session(s); {{ ledger_prefill }} prefill and {{ ledger_decode }} decode tokens
counted.</p>
<table id="ledger-nodes">
<tr><th>node</th><th>sessions</th><th>prefill tokens</th><th>decode tokens</th></tr>
{% for t in by_node %}<tr><td><code>{{ t.node_id }}</code></td><td class="num">{{ t.sessions }}</td>
<td class="num">{{ t.prefill_tokens }}</td><td class="num">{{ t.decode_tokens }}</td></tr>
{% else %}<tr><td colspan="4" class="muted">no work yet</td></tr>
{% endfor %}</table>
<table id="ledger-clients">
<tr><th>client (key)</th><th>sessions</th><th>prefill tokens</th><th>decode tokens</th></tr>
{% for t in by_client %}<tr><td>{{ t.client_id or "(unnamed)" }}</td><td class="num">{{ t.sessions }}</td>
<td class="num">{{ t.prefill_tokens }}</td><td class="num">{{ t.decode_tokens }}</td></tr>
{% else %}<tr><td colspan="4" class="muted">no work yet</td></tr>
{% endfor %}</table>
</body>
</html>
"""

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
_PAGE = _ENV.from_string(_TEMPLATE)


def render(snapshot: RegistrySnapshot, ledger: LedgerView, now: datetime.datetime,
           refresh: int = REFRESH_SECONDS) -> str:
    """The page. `ledger`: its totals as last read (metrics.LedgerTotals)."""
    (sessions, prefill, decode), by_node, by_client = ledger.overall, ledger.by_node, ledger.by_client
    return _PAGE.render(
        refresh=refresh, generated=now.strftime("%Y-%m-%d %H:%M:%S %Z").strip(),
        maps=[coverage_map(m, snapshot.nodes) for m in snapshot.models], nodes=snapshot.nodes,
        routes=snapshot.routes, node_count=snapshot.node_count, route_count=snapshot.route_count,
        ledger_sessions=sessions, ledger_prefill=prefill, ledger_decode=decode, by_node=by_node, by_client=by_client,
        ledger_unavailable=ledger.unavailable, gaps=_ranges, age=_age)
