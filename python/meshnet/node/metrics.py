"""A node's Prometheus series, served at /metrics with `--metrics-listen HOST:PORT` (off by
default; loopback unless told otherwise) by meshnet.webserver, from a CollectorRegistry of its own.

The worker's Health is read on each scrape (a custom collector: no polling thread), over the
node's own channel to its shard service with a bounded timeout; a worker that does not answer
shows as meshnet_node_worker_up 0 and its Health series are left out of that scrape. The node's
main thread updates the rest: tokens it took from the worker for the ledger, the compute rate
it measured for its last heartbeat, restarts, and whether the tracker knows it. Read-only: the
endpoint reveals the node's id, model and layer range, and its load; nothing else.

Series (all prefixed meshnet_node_):
  info{node_id,model,backend,layers}   1
  worker_up                            1 when Health answered within the timeout
  active_sessions, queue_depth, kv_cells_used, kv_cells_total, results_readers, fence_entries
  batch_occupancy_ratio                mean rows per engine decode / the worker's batch rows, since it started
  max_batch_sessions                   most sessions seen in one engine decode
  engine_batches_total, engine_rows_total, engine_compute_seconds_total
  seam_frames_received_total, seam_bytes_received_total
  tokens_total{phase}                  tokens processed (phase: prefill, decode), as taken for the ledger
  decode_tokens_per_second             measured compute rate sent with the last heartbeat
  worker_restarts_total, registered
The engine and seam counters restart from 0 with a restarted worker (Prometheus' rate() allows it).

NodeMetrics keeps the node's own figures as plain numbers; prometheus_client (and the HTTP
stack) is imported only by `serve`, so a node without --metrics-listen never loads it (a lean
node: about 7 MiB of RSS).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional

import grpc

from meshnet.node.worker import MAX_BATCH_TOKENS
from meshnet.protocol.shard_client import ShardClient
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Health

if TYPE_CHECKING:  # the HTTP stack and prometheus_client are imported only when /metrics is served
    from prometheus_client.registry import CollectorRegistry
    from starlette.applications import Starlette

    from meshnet.webserver import WebServer

HEALTH_TIMEOUT_S = 2.0


class HealthProbe:
    """Health of the shard service at `address()` (re-read each call: a restarted worker moves),
    over a channel of its own pinned to `certificate` (None: plaintext). Any thread."""

    def __init__(self, address: Callable[[], str], certificate: Optional[bytes],
                 timeout: float = HEALTH_TIMEOUT_S) -> None:
        self._address, self._certificate, self._timeout = address, certificate, timeout
        self._lock = threading.Lock()
        self._dialled = ""
        self._shard: Optional[ShardClient] = None

    def __call__(self) -> Health:
        with self._lock:
            address = self._address()
            if address != self._dialled or self._shard is None:
                if self._shard is not None:
                    self._shard.close()
                self._shard, self._dialled = ShardClient.dial(address, self._certificate), address
            shard = self._shard
        return shard.health(timeout=self._timeout)

    def close(self) -> None:
        with self._lock:
            if self._shard is not None:
                self._shard.close()
                self._shard = None


class NodeMetrics:
    """The node's own figures (updated by its main thread) and its Health probe; read by the
    scrape thread under the lock."""

    def __init__(self, node_id: str, model: str, backend: tt.BackendKind, layers: tuple[int, int],
                 health: Callable[[], Health]) -> None:
        self.info = {"node_id": node_id, "model": model, "backend": backend.name.lower(),
                     "layers": f"{layers[0]}:{layers[1]}"}
        self.health = health
        self._lock = threading.Lock()
        self._tokens = {"prefill": 0, "decode": 0}
        self._rate = 0.0
        self._restarts = 0
        self._registered = False

    def count_work(self, entries: Iterable[tt.WorkEntry]) -> None:
        """Work taken from the backend (main thread)."""
        prefill = decode = 0
        for e in entries:
            prefill, decode = prefill + e.prefill_tokens, decode + e.decode_tokens
        with self._lock:
            self._tokens["prefill"] += prefill
            self._tokens["decode"] += decode

    def heartbeat(self, load: tt.Load, registered: bool) -> None:
        """After each heartbeat tick (main thread)."""
        with self._lock:
            self._rate = load.decode_tokens_per_second
            self._registered = registered

    def count_restart(self) -> None:
        with self._lock:
            self._restarts += 1

    def own(self) -> tuple[dict[str, int], float, int, bool]:
        """(tokens by phase, compute rate, restarts, registered), one consistent reading."""
        with self._lock:
            return dict(self._tokens), self._rate, self._restarts, self._registered


def registry(metrics: NodeMetrics) -> "CollectorRegistry":
    """A CollectorRegistry of the node's series, read from `metrics` and Health on each collect."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import CollectorRegistry

    class Collector:
        def collect(self) -> Iterator[Metric]:
            info = GaugeMetricFamily("meshnet_node_info", "The node's identity and shard (value 1).",
                                     labels=list(metrics.info))
            info.add_metric(list(metrics.info.values()), 1)
            yield info
            tokens_by_phase, rate, restarts, registered = metrics.own()
            tokens = CounterMetricFamily("meshnet_node_tokens", "Tokens processed by the worker (as taken for the "
                                         "ledger), by phase.", labels=["phase"])
            for phase, count in tokens_by_phase.items():
                tokens.add_metric([phase], count)
            yield tokens
            yield GaugeMetricFamily("meshnet_node_decode_tokens_per_second", "Compute rate measured for the last "
                                    "heartbeat (rows per second of engine time).", value=rate)
            yield CounterMetricFamily("meshnet_node_worker_restarts", "Times the node restarted its worker.",
                                      value=restarts)
            yield GaugeMetricFamily("meshnet_node_registered", "1 while the tracker knows this node.",
                                    value=1 if registered else 0)
            yield from _health_series(metrics.health, GaugeMetricFamily, CounterMetricFamily)

    prometheus = CollectorRegistry()
    prometheus.register(Collector())
    return prometheus


def _health_series(health: Callable[[], Health], gauge, counter) -> Iterator:
    try:
        h = health()
    except (grpc.RpcError, ValueError):  # no answer in time, or a channel closed under us
        h = None
    yield gauge("meshnet_node_worker_up", "1 when the worker answered Health on this scrape.",
                value=0 if h is None else 1)
    if h is None:
        return
    for name, doc, value in (
            ("active_sessions", "Sessions the worker holds.", h.active_sessions),
            ("queue_depth", "Steps waiting for the engine.", h.queue_depth),
            ("kv_cells_used", "KV cache cells in use.", h.kv_cells_used),
            ("kv_cells_total", "KV cache cells in all.", h.kv_cells_total),
            ("batch_occupancy_ratio", "Mean rows per engine decode over the worker's batch rows, since it "
             "started.", h.mean_batch_rows / MAX_BATCH_TOKENS),
            ("max_batch_sessions", "Most sessions seen in one engine decode.", h.max_batch_sessions),
            ("fence_entries", "Session ids with an epoch fence held.", h.fence_entries),
            ("results_readers", "Open Results streams.", h.results_readers)):
        yield gauge(f"meshnet_node_{name}", doc, value=value)
    for name, doc, value in (
            ("engine_batches", "Engine decodes run.", h.batches),
            ("engine_rows", "Rows (token positions) computed in engine decodes (batches times their mean "
             "size, a float32 on the wire, rounded).", round(h.batches * h.mean_batch_rows)),
            ("engine_compute_seconds", "Time spent in engine decodes.", h.compute_us / 1e6),
            ("seam_frames_received", "Seam frames received.", h.seam_frames_in),
            ("seam_bytes_received", "Serialized size of the seam frames received.", h.seam_bytes_in)):
        yield counter(f"meshnet_node_{name}", doc, value=value)


def app(metrics: NodeMetrics) -> "Starlette":
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    prometheus = registry(metrics)

    def scrape(request: Request) -> Response:  # sync: Starlette runs it on a worker thread (Health may wait)
        return Response(generate_latest(prometheus), media_type=CONTENT_TYPE_LATEST,
                        headers={"Cache-Control": "no-store"})

    return Starlette(routes=[Route("/metrics", scrape)])


def serve(metrics: NodeMetrics, listen: str) -> "WebServer":
    """Starts /metrics on `listen` (port 0 picks one: see `.port`)."""
    from meshnet.webserver import WebServer

    return WebServer(app(metrics), listen, name="node-metrics").start()
