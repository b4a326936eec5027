"""What a joining node is assigned (issue 50, item 4), until the planner (issue 51): uncovered
ranges first, the part must fit the memory and disk the node measured, nodes joining at once
spread over the ranges, a node asking again keeps its part, and no fit says why."""

from __future__ import annotations

from meshnet.tracker.assignment import Assignments
from meshnet.weights.manifest import Manifest, Part
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.status import StatusCode

GIB = 1 << 30
PARTS = (Part(0, 10, "m.layers-0-10.gguf", 3 * GIB, "sha256:" + "a" * 64, ("0" * 64,) * 192),
         Part(10, 20, "m.layers-10-20.gguf", 2 * GIB, "sha256:" + "b" * 64, ("0" * 64,) * 128),
         Part(20, 30, "m.layers-20-30.gguf", 3 * GIB, "sha256:" + "c" * 64, ("0" * 64,) * 192))
MODELS = {"m": Manifest("m", "sha256:" + "d" * 64, 30, 16 << 20, PARTS)}
OFFER = tt.AssignRequest(8 * GIB, 100 * GIB, "cpu")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def nobody(model: str, start: int, end: int) -> int:
    return 0


def test_nodes_joining_at_once_spread_over_the_ranges_largest_first():
    assignments = Assignments()
    got = [assignments.assign(NodeId(f"n{i}"), OFFER, MODELS, nobody) for i in range(4)]
    assert [(r.layers.start, r.layers.end) for r in got] == [(0, 10), (20, 30), (10, 20), (0, 10)]
    assert [r.reason for r in got[:3]] == ["uncovered"] * 3
    assert got[3].reason == "the least served part that fits (1 nodes serve or fetch it)"
    assert got[0].part_file == "m.layers-0-10.gguf" and got[0].model == "m"


def test_a_covered_range_is_assigned_after_the_uncovered_one():
    served = {(0, 10): 2, (10, 20): 0, (20, 30): 1}
    reply = Assignments().assign(NodeId("n"), OFFER, MODELS, lambda m, s, e: served[(s, e)])
    assert (reply.layers.start, reply.layers.end) == (10, 20)


def test_only_what_fits_the_measured_memory_and_disk_is_assigned():
    small = tt.AssignRequest(2 * GIB + 1, 100 * GIB, "cpu")
    assert Assignments().assign(NodeId("n"), small, MODELS, nobody).layers == tt.LayerRange(10, 20)
    no_disk = tt.AssignRequest(8 * GIB, GIB, "cpu")
    reply = Assignments().assign(NodeId("n"), no_disk, MODELS, nobody)
    assert reply.status.code == StatusCode.NOT_FOUND
    assert reply.status.message == ("out of memory or disk: the smallest published part needs 2.00 GiB; this node "
                                    "offers 8.00 GiB of memory and 1.00 GiB of disk")
    empty = Assignments().assign(NodeId("n"), OFFER, {}, nobody)
    assert empty.status.message == "this tracker publishes no model (//python:publish)"


def test_a_node_asking_again_keeps_its_part_until_it_lapses_or_registers():
    clock = Clock()
    assignments = Assignments(hold_seconds=60, clock=clock)
    first = assignments.assign(NodeId("a"), OFFER, MODELS, nobody)
    again = assignments.assign(NodeId("a"), OFFER, MODELS, nobody)
    assert again.layers == first.layers and "assigned before" in again.reason
    clock.now = 200.0  # lapsed: the range counts as unserved again
    assert assignments.assign(NodeId("b"), OFFER, MODELS, nobody).layers == first.layers
    assignments.release(NodeId("b"))  # it registered: now the coverage map counts it
    assert assignments.assign(NodeId("c"), OFFER, MODELS, nobody).layers == first.layers


def test_each_nodes_last_decision_is_kept_for_the_operator():
    clock = Clock()
    assignments = Assignments(hold_seconds=60, clock=clock)
    assignments.assign(NodeId("a"), OFFER, MODELS, nobody)
    assignments.assign(NodeId("b"), tt.AssignRequest(GIB, GIB, "vulkan0"), MODELS, nobody)
    a, b = assignments.decisions()
    assert (a.node_id, a.model, a.layers, a.part, a.reason, a.fetching) == (
        "a", "m", (0, 10), "m.layers-0-10.gguf", "uncovered", True)
    assert (a.memory_bytes, a.disk_free_bytes, a.device) == (8 * GIB, 100 * GIB, "cpu")
    assert b.model == "" and b.layers is None and b.reason.startswith("out of memory or disk") and not b.fetching
    assignments.release(NodeId("a"))  # registered: no longer fetching, its decision still shown
    assert [d.fetching for d in assignments.decisions()] == [False, False]


def test_decisions_are_bounded():
    from meshnet.tracker.assignment import MAX_DECISIONS

    assignments = Assignments()
    for i in range(MAX_DECISIONS + 5):
        assignments.assign(NodeId(f"n{i:05d}"), tt.AssignRequest(1, 1, "cpu"), MODELS, nobody)
    kept = assignments.decisions()
    assert len(kept) == MAX_DECISIONS and kept[0].node_id == "n00005"  # the oldest forgotten first


def test_a_part_the_node_cannot_hold_is_not_assigned_to_it_again():
    assignments = Assignments()
    first = assignments.assign(NodeId("a"), OFFER, MODELS, nobody)
    refused = tt.AssignRequest(OFFER.memory_bytes, OFFER.disk_free_bytes, "cpu", (first.part_file,))
    second = assignments.assign(NodeId("a"), refused, MODELS, nobody)  # its held assignment is dropped
    assert second.status.ok and second.part_file != first.part_file
    all_refused = tt.AssignRequest(OFFER.memory_bytes, OFFER.disk_free_bytes, "cpu", tuple(p.file for p in PARTS))
    reply = Assignments().assign(NodeId("b"), all_refused, MODELS, nobody)
    assert reply.status.code == StatusCode.NOT_FOUND
    assert reply.status.message.startswith("out of memory: this node measured it cannot hold m.layers-0-10.gguf")
