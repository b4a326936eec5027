"""The doctor (issue 50, item 7): for every node, what it serves, what it offered, what it was
assigned and why, whether it still fetches, and why a node was not placed."""

from __future__ import annotations

from meshnet.tracker.doctor import explain, main

GIB = 1 << 30


def decision(node_id: str, **change) -> dict:
    base = {"node_id": node_id, "at": 0.0, "memory_bytes": 6 * GIB, "disk_free_bytes": 80 * GIB, "device": "cpu",
            "model": "m", "layers": [0, 10], "part": "m.layers-0-10.gguf", "reason": "uncovered", "fetching": False}
    return {**base, **change}


def node(node_id: str) -> dict:
    return {"node_id": node_id, "model": "m", "layers": [0, 10], "state": "routable", "routes": 2,
            "heartbeat_age_s": 0.4}


def test_every_node_is_explained():
    status = {"nodes": [node("a"), node("hand")],
              "joining": [decision("a"), decision("b", fetching=True),
                          decision("c", model="", layers=None, part="", reason="out of memory or disk: ...")],
              "models": [{"model": "m", "gaps": [[10, 30]]}]}
    assert explain(status) == [
        "a",
        "  serves m layers 0-10 (routable, 2 routes, heartbeat 0.4 s ago)",
        "  offered 6.00 GiB of memory and 80.00 GiB of disk on cpu",
        "  assigned m layers 0-10 (m.layers-0-10.gguf): uncovered",
        "b",
        "  offered 6.00 GiB of memory and 80.00 GiB of disk on cpu",
        "  assigned m layers 0-10 (m.layers-0-10.gguf): uncovered",
        "  fetching its part (assigned, not registered yet)",
        "c",
        "  offered 6.00 GiB of memory and 80.00 GiB of disk on cpu",
        "  not placed: out of memory or disk: ...",
        "hand",
        "  serves m layers 0-10 (routable, 2 routes, heartbeat 0.4 s ago)",
        "  placed by hand (--layers): it did not join through the tracker",
        "m: layers 10-30 have no routable node",
    ]
    assert explain({}) == ["no node has registered or asked to join"]


def test_an_unreachable_tracker_is_an_error(capsys):
    assert main(["--status", "http://127.0.0.1:9/status.json"]) == 2
    assert "doctor: cannot read http://127.0.0.1:9/status.json" in capsys.readouterr().err
