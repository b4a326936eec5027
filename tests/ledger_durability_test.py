"""Ledger durability: 10,000 work records reported over gRPC while the tracker process is
SIGKILLed at random moments and restarted on the same database; every acknowledged record must
be in the ledger afterwards (unacknowledged ones may or may not be: the client retries them)."""

from __future__ import annotations

import random
import threading
import time

import grpc

from meshnet.protocol.tracker_client import TrackerClient
from meshnet.tracker.ledger import Ledger
from meshnet.types import tracker as tt
from meshnet.types.ids import NodeId
from meshnet.types.seam import RouteSession
from tracker_process import SECRET, TrackerProcess

RECORDS = 10_000
WORKERS = 6
KILLS = 3


def test_acknowledged_records_survive_sigkill(tmp_path):
    tracker = TrackerProcess(tmp_path, []).start()
    rng = random.Random(20261129)
    pending = list(range(RECORDS))
    acked: set[int] = set()
    lock = threading.Lock()
    address = {"value": tracker.address}
    done = threading.Event()

    def worker() -> None:
        client, client_address = None, None
        while not done.is_set():
            with lock:
                if not pending:
                    return
                i = pending.pop()
            if client_address != address["value"]:
                client_address = address["value"]
                client = TrackerClient(client_address, SECRET, timeout=5)
            entry = tt.WorkEntry(RouteSession(f"rec-{i:05d}", 1), prefill_tokens=i, decode_tokens=1)
            try:
                ok = client.report_work(tt.WorkReport(NodeId(f"node-{i % 4}"), (entry,))).status.ok
            except grpc.RpcError:
                ok = False
            with lock:
                if ok:
                    acked.add(i)
                else:
                    pending.append(i)  # retried later, maybe on the restarted tracker
            if not ok:
                time.sleep(0.05)

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    kills = []
    for _ in range(KILLS):
        time.sleep(rng.uniform(0.5, 4.0))
        with lock:
            before = len(acked)
        tracker.kill()
        kills.append(before)
        tracker.start()  # same database, new port
        address["value"] = tracker.address
    for t in threads:
        t.join(timeout=600)
    done.set()
    assert tracker.stop() == 0
    assert len(acked) == RECORDS, f"only {len(acked)} acknowledged"
    assert len(kills) == KILLS and all(0 < k < RECORDS for k in kills), kills

    present = Ledger(tracker.db).sessions()
    missing = sorted(i for i in acked if f"rec-{i:05d}" not in present)
    assert missing == [], f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
    print(f"kills after {kills} acknowledged records; {len(present)} distinct records in the ledger")
