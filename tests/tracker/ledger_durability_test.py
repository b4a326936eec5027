"""Ledger durability: 10,000 work records reported over gRPC (signed by 4 node identities, for
triples issued beforehand) while the tracker process is SIGKILLed at random moments and
restarted on the same database; every acknowledged record must be in the ledger afterwards
(unacknowledged ones may or may not be: the client retries them, with the same report id, so a
record acknowledged late is still counted once)."""

from __future__ import annotations

import random
import threading
import time

import grpc

from meshnet.identity.keys import Identity
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.wire import tracker as tt
from meshnet.wire.seam import RouteSession
from tracker_process import TrackerProcess

RECORDS = 10_000
WORKERS = 6
KILLS = 3


def test_acknowledged_records_survive_sigkill(tmp_path):
    nodes = [Identity.generate() for _ in range(4)]
    issuer = Ledger(tmp_path / "tracker.db")
    issuer.issue([(f"rec-{i:05d}", 1, nodes[i % 4].node_id) for i in range(RECORDS)], RECORDS + 1)
    issuer.close()
    tracker = TrackerProcess(tmp_path, []).start()
    rng = random.Random(20261129)
    pending = list(range(RECORDS))
    acked: set[int] = set()
    lock = threading.Lock()
    address = {"value": tracker.address}
    done = threading.Event()

    def worker() -> None:
        clients, client_address = [], None
        while not done.is_set():
            with lock:
                if not pending:
                    return
                i = pending.pop()
            if client_address != address["value"]:
                client_address = address["value"]
                clients = [tracker.client("node", key, timeout=5) for key in nodes]
            entry = tt.WorkEntry(RouteSession(f"rec-{i:05d}", 1), prefill_tokens=i, decode_tokens=1)
            try:
                report = tt.WorkReport(nodes[i % 4].node_id, (entry,), report_id=i + 1)
                ok = clients[i % 4].report_work(report).status.ok
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
