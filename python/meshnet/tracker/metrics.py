"""The tracker's Prometheus series, in a CollectorRegistry of its own (one per tracker instance,
so tests can run several in one process).

service.py increments the counters from gRPC threads (prometheus_client metrics are
thread-safe); `collect()` runs on each scrape (tracker/web/web.py) and reads the registry's snapshot
and the ledger's totals. Series (all prefixed meshnet_):
  tracker_route_opens_total{model,code}        OpenRoute answers by status code
  tracker_failovers_total{code}                ReportFailure answers (OK: a new epoch and route)
  tracker_refusals_total{method,code}          calls answered with anything but OK
  tracker_rpc_duration_seconds{method}         histogram of handling time
  tracker_nodes{model,state}                   live nodes (state: routable, draining, banned, dark)
  tracker_live_routes{model}                   leased route sessions
  tracker_layers{model}, tracker_uncovered_layers{model}, tracker_layer_coverage_ratio{model},
  tracker_min_layer_replicas{model}            the coverage map in numbers
  ledger_up                                    0 while the ledger's database cannot be reached
  ledger_tokens_total{phase}, ledger_sessions_total      all work counted (phase: prefill, decode)
  ledger_node_tokens_total{node_id,phase}, ledger_node_sessions_total{node_id}
  ledger_client_tokens_total{client_id,phase}, ledger_client_sessions_total{client_id}
Invariant: label values are bounded: models are the certified ones (anything else is
"(uncertified)"), codes and methods are enums, and the per-node and per-client ledger series are
the `ledger_top` with the most tokens (the overall totals count everyone). Ledger totals are
read at most once per `ledger_ttl` seconds, however often the endpoints are hit.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from meshnet.tracker.ledger.ledger import ClientTotals, Ledger, NodeTotals
from meshnet.tracker.ledger.ledger_store import LedgerUnavailable
from meshnet.tracker.registry import Registry
from meshnet.tracker.snapshot import STATES, UNCERTIFIED, RegistrySnapshot

LEDGER_TOP = 100  # nodes and clients with their own ledger series
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclasses.dataclass(frozen=True)
class LedgerView:
    """The ledger's totals as last read: (sessions, prefill, decode) overall, the top nodes and
    clients, and why the latest read failed (None when it did not; the totals are then the last
    ones read, zeros if none ever was)."""

    overall: tuple[int, int, int] = (0, 0, 0)
    by_node: tuple[NodeTotals, ...] = ()
    by_client: tuple[ClientTotals, ...] = ()
    unavailable: Optional[str] = None


class LedgerTotals:
    """The ledger's totals, cached for `ttl` seconds (thread-safe; the SQL runs on a miss). A
    ledger database that cannot be reached does not fail the endpoints: the view says so."""

    def __init__(self, ledger: Ledger, *, top: int = LEDGER_TOP, ttl: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ledger, self._top, self._ttl, self._clock = ledger, top, ttl, clock
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._view = LedgerView()

    def get(self) -> LedgerView:
        with self._lock:
            if self._clock() - self._at >= self._ttl:
                try:
                    self._view = LedgerView(self._ledger.overall(), tuple(self._ledger.totals(limit=self._top)),
                                            tuple(self._ledger.totals_by_client(limit=self._top)))
                except LedgerUnavailable as err:  # names the database without its password
                    self._view = dataclasses.replace(self._view, unavailable=str(err))
                self._at = self._clock()
            return self._view


class TrackerMetrics:
    def __init__(self, registry: Registry, ledger: Ledger, *, ledger_top: int = LEDGER_TOP,
                 ledger_ttl: float = 2.0) -> None:
        self.prometheus = CollectorRegistry()
        self._models = registry.models
        self.ledger_top = ledger_top
        self.ledger_totals = LedgerTotals(ledger, top=ledger_top, ttl=ledger_ttl)
        self._registry = registry
        self.route_opens = Counter("meshnet_tracker_route_opens", "OpenRoute answers by model and status code.",
                                   ["model", "code"], registry=self.prometheus)
        self.failovers = Counter("meshnet_tracker_failovers", "ReportFailure answers by status code (OK: the route "
                                 "got a new epoch and hops).", ["code"], registry=self.prometheus)
        self.refusals = Counter("meshnet_tracker_refusals", "Tracker calls answered with a status other than OK.",
                                ["method", "code"], registry=self.prometheus)
        self.rpc_seconds = Histogram("meshnet_tracker_rpc_duration_seconds", "Time to handle a tracker call.",
                                     ["method"], buckets=RPC_BUCKETS, registry=self.prometheus)
        self.prometheus.register(_StateCollector(self))

    def model_label(self, model: str) -> str:
        """`model` if certified here, else one shared label (client-supplied names stay bounded)."""
        return model if model in self._models else UNCERTIFIED

    def answered(self, method: str, code: str, seconds: float) -> None:
        """One call handled (gRPC threads)."""
        self.rpc_seconds.labels(method).observe(seconds)
        if code != "OK":
            self.refusals.labels(method, code).inc()

    def snapshot(self) -> RegistrySnapshot:
        return self._registry.snapshot()


class _StateCollector:
    """Gauges and ledger counters read on scrape."""

    def __init__(self, metrics: TrackerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self._metrics.snapshot()
        yield from _registry_families(snap)
        yield from _ledger_families(self._metrics.ledger_totals.get(), top=self._metrics.ledger_top)


def _registry_families(snap: RegistrySnapshot) -> Iterator[Metric]:
    nodes = GaugeMetricFamily("meshnet_tracker_nodes", "Live nodes by model and state.", labels=["model", "state"])
    counts = dict(snap.node_states)
    for model in snap.models:  # every state of every certified model, so a series exists at 0
        for state in STATES:
            counts.setdefault((model.model, state), 0)
    for (model, state), count in sorted(counts.items()):
        nodes.add_metric([model, state], count)
    routes = GaugeMetricFamily("meshnet_tracker_live_routes", "Leased route sessions by model.", labels=["model"])
    layers = GaugeMetricFamily("meshnet_tracker_layers", "Transformer layers of a certified model.", labels=["model"])
    uncovered = GaugeMetricFamily("meshnet_tracker_uncovered_layers", "Layers no routable node serves.",
                                  labels=["model"])
    ratio = GaugeMetricFamily("meshnet_tracker_layer_coverage_ratio", "Share of layers served by a routable node.",
                              labels=["model"])
    replicas = GaugeMetricFamily("meshnet_tracker_min_layer_replicas",
                                 "Routable nodes serving the least-served layer (0: a gap).", labels=["model"])
    for model in snap.models:
        routes.add_metric([model.model], snap.live_routes.get(model.model, 0))
        layers.add_metric([model.model], model.n_layer)
        uncovered.add_metric([model.model], sum(1 for r in model.replicas if r == 0))
        ratio.add_metric([model.model], model.covered_ratio)
        replicas.add_metric([model.model], min(model.replicas, default=0))
    yield from (nodes, routes, layers, uncovered, ratio, replicas)


def _ledger_families(view: LedgerView, *, top: int) -> Iterator[Metric]:
    yield GaugeMetricFamily("meshnet_ledger_up", "1 if the latest read of the ledger's totals succeeded, 0 if its "
                            "database could not be reached (the ledger series then hold the last totals read).",
                            value=0 if view.unavailable else 1)
    (sessions, prefill, decode), by_node, by_client = view.overall, view.by_node, view.by_client
    tokens = CounterMetricFamily("meshnet_ledger_tokens", "Tokens counted in the work ledger, by phase.",
                                 labels=["phase"])
    tokens.add_metric(["prefill"], prefill)
    tokens.add_metric(["decode"], decode)
    yield tokens
    yield CounterMetricFamily("meshnet_ledger_sessions", "Route sessions with work in the ledger.", value=sessions)
    for kind, label, rows in (("node", "node_id", by_node), ("client", "client_id", by_client)):
        tokens = CounterMetricFamily(f"meshnet_ledger_{kind}_tokens", f"Ledger tokens per {kind} (the {top} "
                                     "with the most), by phase.", labels=[label, "phase"])
        sessions = CounterMetricFamily(f"meshnet_ledger_{kind}_sessions",
                                       f"Route sessions with work per {kind} (the {top} with the most tokens).",
                                       labels=[label])
        for row in rows:
            name = row.node_id if kind == "node" else row.client_id
            tokens.add_metric([name, "prefill"], row.prefill_tokens)
            tokens.add_metric([name, "decode"], row.decode_tokens)
            sessions.add_metric([name], row.sessions)
        yield tokens
        yield sessions
