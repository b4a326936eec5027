"""Node metrics: Health is read on each scrape from the shard service (a fake one on loopback
gRPC), follows a worker that moved, is bounded in time when the worker hangs, and the node's own
counters and gauges move with the work and heartbeats it is given."""

from __future__ import annotations

import threading
import time
import urllib.request
from concurrent import futures

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshnet.node import metrics as node_metrics
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.wire import tracker as tt
from meshnet.wire.seam import RouteSession


class FakeShard(shard_pb2_grpc.ShardServicer):
    """Answers Health with `reply`; while `hang` is set, not at all until it clears."""

    def __init__(self, reply: shard_pb2.HealthReply) -> None:
        self.reply = reply
        self.hang = threading.Event()
        self.calls = 0

    def Health(self, request, context):  # noqa: N802
        self.calls += 1
        while self.hang.is_set() and context.is_active():
            time.sleep(0.01)
        return self.reply


@pytest.fixture
def shards():
    started = []

    def start(reply: shard_pb2.HealthReply) -> tuple[FakeShard, str]:
        servicer = FakeShard(reply)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        shard_pb2_grpc.add_ShardServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append(server)
        return servicer, f"127.0.0.1:{port}"

    yield start
    for server in started:
        server.stop(grace=0).wait()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_health_counters_and_gauges_on_each_scrape(shards):
    worker, address = shards(shard_pb2.HealthReply(active_sessions=3, queue_depth=2, kv_cells_used=100,
                                                    kv_cells_total=4096, batches=10, mean_batch_rows=64.0,
                                                    compute_us=2_500_000, seam_frames_in=7, seam_bytes_in=7000))
    moved, moved_address = shards(shard_pb2.HealthReply(active_sessions=1))
    where = [address]
    probe = node_metrics.HealthProbe(lambda: where[0], None)
    metrics = node_metrics.NodeMetrics("n-abc", "smol", tt.BackendKind.GGUF, (0, 15), probe)
    server = node_metrics.serve(metrics, "127.0.0.1:0")
    try:
        before = scrape(server.url)
        assert before[("meshnet_node_worker_up", ())] == 1
        assert before[("meshnet_node_active_sessions", ())] == 3 and before[("meshnet_node_queue_depth", ())] == 2
        assert before[("meshnet_node_kv_cells_used", ())] == 100 and before[("meshnet_node_kv_cells_total", ())] == 4096
        assert before[("meshnet_node_batch_occupancy_ratio", ())] == 0.25
        assert before[("meshnet_node_engine_rows_total", ())] == 640
        assert before[("meshnet_node_engine_compute_seconds_total", ())] == 2.5
        assert before[("meshnet_node_seam_bytes_received_total", ())] == 7000
        assert before[("meshnet_node_tokens_total", (("phase", "decode"),))] == 0
        assert before[("meshnet_node_info", (("backend", "gguf"), ("layers", "0:15"), ("model", "smol"),
                                              ("node_id", "n-abc")))] == 1
        metrics.count_work([tt.WorkEntry(RouteSession("s", 1), 12, 3), tt.WorkEntry(RouteSession("t", 1), 0, 4)])
        metrics.heartbeat(tt.Load(decode_tokens_per_second=321.0), registered=True)
        metrics.count_restart()
        worker.reply = shard_pb2.HealthReply(active_sessions=0, batches=11, mean_batch_rows=64.0)
        after = scrape(server.url)
        assert worker.calls == 2  # one Health per scrape, no polling in between
        assert after[("meshnet_node_tokens_total", (("phase", "prefill"),))] == 12
        assert after[("meshnet_node_tokens_total", (("phase", "decode"),))] == 7
        assert after[("meshnet_node_decode_tokens_per_second", ())] == 321.0
        assert after[("meshnet_node_registered", ())] == 1
        assert after[("meshnet_node_worker_restarts_total", ())] == 1
        assert after[("meshnet_node_active_sessions", ())] == 0 and after[("meshnet_node_engine_batches_total", ())] == 11
        where[0] = moved_address  # a restarted worker listens elsewhere: the probe follows it
        assert scrape(server.url)[("meshnet_node_active_sessions", ())] == 1 and moved.calls == 1
    finally:
        server.stop()
        probe.close()


def test_a_hung_worker_costs_a_scrape_at_most_the_timeout(shards):
    worker, address = shards(shard_pb2.HealthReply(active_sessions=1))
    probe = node_metrics.HealthProbe(lambda: address, None, timeout=0.3)
    metrics = node_metrics.NodeMetrics("n-abc", "smol", tt.BackendKind.GGUF, (0, 15), probe)
    server = node_metrics.serve(metrics, "127.0.0.1:0")
    try:
        worker.hang.set()
        started = time.monotonic()
        samples = scrape(server.url)
        assert time.monotonic() - started < 2.0
        assert samples[("meshnet_node_worker_up", ())] == 0
        assert ("meshnet_node_active_sessions", ()) not in samples
        assert ("meshnet_node_tokens_total", (("phase", "prefill"),)) in samples  # the node's own series stay
        worker.hang.clear()
        assert scrape(server.url)[("meshnet_node_worker_up", ())] == 1
    finally:
        worker.hang.clear()
        server.stop()
        probe.close()
