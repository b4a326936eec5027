"""The tracker's read-only HTTP endpoints (`--http-listen HOST:PORT`, off by default, loopback
unless told otherwise), served by meshnet.webserver (uvicorn on a daemon thread; see there why):

  GET /metrics      Prometheus text exposition of tracker/metrics.py's series
  GET /status       the swarm status page (status_page.py): coverage maps, nodes, routes, ledger;
                    it reloads itself every 2 s
  GET /status.json  the same data as JSON, with each joining node's last assignment or refusal
                    ("joining": what it offered, what it was given and why; issue 50)
  GET /             redirects to /status

What they reveal, to anyone who can reach the port: the live nodes (ids, advertised addresses,
models, layer ranges, state, load telemetry, heartbeat age), each live route's model, epoch,
client_id, hops and an 8-character tag of its session id, the coverage per certified model, the
ledger's token totals per node and per client_id, and what each joining node offered (memory,
disk, device) and was assigned. What they never reveal: role tokens,
route tickets, full route session ids, keys or certificates. They only read: no request changes
the registry or the ledger, and none can make the tracker allocate more than the bounded
snapshot and ledger totals (tracker/snapshot.py, tracker/metrics.py) that every request reuses.
Endpoints run on Starlette's worker threads (they take the registry lock and may query SQLite).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from meshnet.tracker import snapshot as snap
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.web import status_page
from meshnet.webserver import WebServer

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_PAGE_HEADERS = {**_HEADERS, "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
                 "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}


def app(metrics: TrackerMetrics, joining: Callable[[], list[dict]] = list) -> Starlette:
    def scrape(request: Request) -> Response:
        return Response(generate_latest(metrics.prometheus), media_type=CONTENT_TYPE_LATEST, headers=_HEADERS)

    def status(request: Request) -> Response:
        page = status_page.render(metrics.snapshot(), metrics.ledger_totals.get(),
                                  datetime.datetime.now(datetime.timezone.utc))
        return HTMLResponse(page, headers=_PAGE_HEADERS)

    def status_json(request: Request) -> Response:
        view = metrics.ledger_totals.get()
        (sessions, prefill, decode) = view.overall
        ledger = {"sessions": sessions, "prefill_tokens": prefill, "decode_tokens": decode,
                  "by_node": [dataclasses.asdict(t) for t in view.by_node],
                  "by_client": [dataclasses.asdict(t) for t in view.by_client], "unavailable": view.unavailable}
        return JSONResponse(snap.as_json(metrics.snapshot(), {"ledger": ledger, "joining": joining()}),
                            headers=_HEADERS)

    def root(request: Request) -> Response:
        return RedirectResponse("/status")

    return Starlette(routes=[Route("/metrics", scrape), Route("/status", status), Route("/status.json", status_json),
                             Route("/", root)])


def serve(metrics: TrackerMetrics, listen: str, joining: Callable[[], list[dict]] = list) -> WebServer:
    """Starts the endpoints on `listen` (port 0 picks one: see `.port`). `joining`: the joining
    nodes' decisions (TrackerService.joining)."""
    return WebServer(app(metrics, joining), listen, name="tracker-http").start()
