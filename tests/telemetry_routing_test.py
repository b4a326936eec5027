"""Issue 13: telemetry that routes. Two GGUF nodes each serve the whole SmolLM2 Q4_1; the one the
tracker picks while both are unmeasured (the tie-break) gets its worker limited to a twentieth
of a core (a cgroup CPU quota; root only, skipped with the reason otherwise). Once both have served
and reported their measured compute rate in heartbeats, new routes go to the other one.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshnet.client.session import GenerationParams, RouteClient
from meshnet.swarm.local import LocalSwarm
from meshnet.wire import tracker as tt

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
PROMPT = [504, 3575, 282, 4649, 314]  # "The capital of France is"
CPU_V1 = Path("/sys/fs/cgroup/cpu")
CPU_V2 = Path("/sys/fs/cgroup/unified")


def _cgroup_problem() -> Optional[str]:
    if os.geteuid() != 0:
        return "not root: limiting a worker's CPU needs a cgroup"
    if (CPU_V1 / "cpu.cfs_quota_us").exists() or (CPU_V2 / "cgroup.controllers").exists():
        return None
    return "no cgroup CPU controller (v1 cpu or v2) is mounted"


pytestmark = pytest.mark.skipif(_cgroup_problem() is not None, reason=str(_cgroup_problem()))


class CpuLimit:
    """Moves a process into a new cgroup whose CPU quota is `fraction` of one core."""

    def __init__(self, pid: int, fraction: float) -> None:
        period = 100_000
        if (CPU_V1 / "cpu.cfs_quota_us").exists():
            self.path = CPU_V1 / f"meshnet-throttle-{pid}"
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text(str(int(period * fraction)))
        else:
            self.path = CPU_V2 / f"meshnet-throttle-{pid}"
            self.path.mkdir()
            (self.path / "cpu.max").write_text(f"{int(period * fraction)} {period}")
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        if self.path.exists():
            parent = self.path.parent / "cgroup.procs"
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    parent.write_text(pid)
                except OSError:
                    pass  # the process is gone
            self.path.rmdir()


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with LocalSwarm(tmp_path_factory.mktemp("telemetry"), GGUF, [(0, 30), (0, 30)], backend="gguf",
                    worker_binary=WORKER, max_sessions=4, threads=1, node_metrics=True) as s:
        yield s


def route_node(tracker) -> str:
    reply = tracker.open_route(tt.OpenRouteRequest("smollm2", "probe", 64))
    assert reply.status.ok and len(reply.hops) == 1, reply.status
    assert tracker.close_route(reply.session).status.ok
    return reply.hops[0].node.node_id


def generate(tracker, tokens: int = 24) -> list[int]:
    return list(RouteClient(tracker, "smollm2").generate(PROMPT, GenerationParams(max_tokens=tokens)))


def node_rates(swarm) -> dict[str, float]:
    """Each node's compute rate as it sent it with its last heartbeat (its /metrics)."""
    rates = {}
    for node_id, node in swarm.nodes.items():
        with urllib.request.urlopen(node.metrics_url + "/metrics", timeout=10) as reply:
            text = reply.read().decode()
        rates[node_id] = next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                              if s.name == "meshnet_node_decode_tokens_per_second")
    return rates


def rates_once_measured(swarm, within_s: float = 30.0) -> dict[str, float]:
    """The nodes' rates once every node has measured one and sent it with a heartbeat (every
    0.5 s here; a loaded machine delays them)."""
    deadline = time.monotonic() + within_s
    while not all(node_rates(swarm).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # one heartbeat more: the metric is set as the heartbeat is sent
    return node_rates(swarm)


def routes_opened(swarm) -> list[list]:
    """The hops of every route the tracker opened, from its log (for a failure's message)."""
    lines = [json.loads(line) for line in swarm.tracker.log.read_text().splitlines() if line.startswith("{")]
    return [line["hops"] for line in lines if line.get("event") == "open_route"]


def test_a_throttled_replica_is_avoided_once_measured(swarm):
    with swarm.client() as tracker:
        unmeasured_choice = route_node(tracker)
        assert route_node(tracker) == unmeasured_choice  # deterministic while nothing is measured
        worker = psutil.Process(swarm.nodes[unmeasured_choice].proc.pid).children()[0]
        # A twentieth of a core. The quota caps the throttled worker, but the other node shares the
        # machine with everything else a CI run does: with some ten runnable threads on 2 cores it
        # gets about a fifth of one too. A fifth here failed once in CI (stop 49), most likely so; a
        # failure now names both measured rates and the routes the tracker opened.
        limit = CpuLimit(worker.pid, 0.05)
        try:
            # Two sessions at once: the tracker spreads them (load), so both nodes serve and measure.
            # On a loaded CI machine one thread's session may open only after the other's closed,
            # and both then take the same node (seen once at df5aaae): the pair is sent again, at
            # most three times, until both nodes have measured. Setup only; the checks below hold.
            for attempt in range(3):
                with ThreadPoolExecutor(2) as pool:
                    outputs = list(pool.map(lambda _: generate(tracker), range(2)))
                assert outputs[0] == outputs[1]
                rates = rates_once_measured(swarm, within_s=30.0 if attempt == 2 else 10.0)
                if all(rates.values()):
                    break
            assert all(rates.values()), (rates, routes_opened(swarm))
            choices = [route_node(tracker) for _ in range(5)]
            assert unmeasured_choice not in choices, (choices, rates, routes_opened(swarm))
            assert generate(tracker) == outputs[0]  # and the route it picks gives the same tokens
        finally:
            limit.remove()
