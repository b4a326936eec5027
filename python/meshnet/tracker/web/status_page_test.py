"""Status page: hostile strings are escaped, the coverage map marks gaps and states, wide models
stay within the column bound, and the page shows nodes, routes and ledger totals."""

from __future__ import annotations

import datetime

from meshnet.tracker import snapshot as snap
from meshnet.tracker.ledger.ledger import ClientTotals, NodeTotals
from meshnet.tracker.metrics import LedgerView
from meshnet.tracker.web.status_page import MAX_COLUMNS, coverage_map, render
from meshnet.wire import tracker as tt

NOW = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
HOSTILE = '<script>alert("x")</script>'


def info(node_id, start, end, *, model="smol", address="127.0.0.1:1"):
    return tt.NodeInfo(node_id, address, tt.BackendKind.GGUF, model, "llama", None, "", tt.LayerRange(start, end),
                       None, 30)


def facts(node_id, start, end, state="routable", **kw):
    load = tt.Load(active_sessions=2, decode_tokens_per_second=123.4)
    return snap.NodeFacts(info(node_id, start, end, **kw), state, load, last_heartbeat=99.0)


def route(session_id, *hops, client_id="key:alice"):
    return snap.RouteFacts(session_id, "smol", 3, client_id,
                           tuple(tt.Hop(info(n, s, e), tt.LayerRange(s, e)) for n, s, e in hops), 90.0, 130.0)


LEDGER = LedgerView((2, 50, 7), (NodeTotals("n-a", 2, 50, 7),), (ClientTotals("key:alice", 2, 50, 7),))


def test_hostile_node_supplied_strings_are_escaped():
    nodes = [facts("n-" + HOSTILE, 0, 30, address=HOSTILE), facts("n-b", 0, 30, model=HOSTILE, state="dark")]
    routes = [route("rs-0123456789abcdef", ("n-" + HOSTILE, 0, 30), client_id=HOSTILE)]
    ledger = LedgerView((1, 1, 1), (NodeTotals(HOSTILE, 1, 1, 1),), (ClientTotals(HOSTILE, 1, 1, 1),), HOSTILE)
    page = render(snap.build({"smol": 30}, nodes, routes, now=100.0), ledger, NOW)
    assert "<script>" not in page and HOSTILE not in page
    assert page.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") >= 7  # ids, address, model, client, ledger


def test_the_coverage_map_shows_gaps_and_states():
    nodes = [facts("n-a", 0, 10), facts("n-b", 10, 20, state="draining"), facts("n-c", 20, 30)]
    model = snap.build({"smol": 30}, nodes, [], now=100.0)
    (view,) = model.models
    assert view.gaps == ((10, 20),)  # a draining node does not cover
    grid = coverage_map(view, model.nodes)
    assert [c.replicas for c in grid.columns] == [1] * 10 + [0] * 10 + [1] * 10
    assert [r.node.node_id for r in grid.rows] == ["n-a", "n-b", "n-c"]
    assert grid.rows[1].served == (False,) * 10 + (True,) * 10 + (False,) * 10
    page = render(model, LEDGER, NOW)
    assert page.count('class="cell gap"') == 10 and page.count('class="cell covered"') == 20
    assert page.count('class="cell draining"') == 10 and page.count('class="cell routable"') == 20
    assert "Gaps: layers 10..19" in page and '<meta http-equiv="refresh" content="2">' in page


def test_a_wide_model_groups_layers_into_bounded_columns():
    nodes = [facts("n-a", 0, 2048, model="big"), facts("n-b", 2049, 4096, model="big")]  # layer 2048 is a gap
    model = snap.build({"big": 4096}, nodes, [], now=100.0)
    grid = coverage_map(model.models[0], model.nodes)
    assert len(grid.columns) <= MAX_COLUMNS
    assert sum(c.end - c.start for c in grid.columns) == 4096
    assert [c for c in grid.columns if c.replicas == 0] == [c for c in grid.columns if c.start <= 2048 < c.end]


def test_the_page_lists_nodes_routes_and_ledger_totals():
    nodes = [facts("n-a", 0, 15), facts("n-b", 15, 30)]
    routes = [route("rs-0123456789abcdef", ("n-a", 0, 15), ("n-b", 15, 30))]
    page = render(snap.build({"smol": 30}, nodes, routes, now=100.0), LEDGER, NOW)
    assert page.count('<tr data-node="n-a">') == 1 and page.count('data-node="n-b"') == 2  # table + map row
    assert "[0, 15)" in page and "123.4" in page and "1.0 s ago" in page
    assert "<code>01234567</code>" in page and "0123456789abcdef" not in page  # a tag, not the session id
    assert "key:alice" in page and ">50<" in page and "ledger-unavailable" not in page


def test_the_json_view_has_the_same_facts():
    nodes = [facts("n-a", 0, 30)]
    view = snap.as_json(snap.build({"smol": 30}, nodes, [route("rs-ffff0000aaaa", ("n-a", 0, 30))], now=100.0))
    assert view["nodes"][0]["node_id"] == "n-a" and view["nodes"][0]["layers"] == [0, 30]
    assert view["routes"][0]["hops"] == [["n-a", 0, 30]] and view["routes"][0]["tag"] == "ffff0000"
    assert view["models"][0]["covered_ratio"] == 1.0
