"""The route lanes' figures from the hops' Health: each hop's stages per step between two snapshots."""

from __future__ import annotations

from meshnet.bench import schema
from meshnet.bench.route_lanes import hop_stages
from meshnet.wire.seam import Health, StepTimes


def health(steps: int, admit: int, wait: int, queue: int, engine: int, after: int, send: int,
           reply: int) -> Health:
    return Health(step_times=StepTimes(
        steps=steps, admit_us=admit, wait_us=wait, queue_us=queue, engine_us=engine, after_us=after,
        send_us=send, reply_us=reply))


def test_hop_stages_are_means_per_step_between_snapshots():
    # The second hop reports no step times at all, as the reference backend.
    before = [health(10, 100, 5000, 300, 4000, 20, 300, 40), Health()]
    after = [health(14, 180, 7000, 340, 5600, 60, 700, 80), Health()]
    stages = hop_stages(before, after)
    assert stages == [
        {"steps": 4, "admit_us": 20.0, "wait_us": 500.0, "queue_us": 10.0, "engine_us": 400.0, "wake_us": 90.0,
         "after_us": 10.0, "send_us": 100.0, "reply_us": 10.0},
        {"steps": 0, "admit_us": None, "wait_us": None, "queue_us": None, "engine_us": None, "wake_us": None,
         "after_us": None, "send_us": None, "reply_us": None}]  # a hop that timed no step (the reference backend)
    cell = {"prompt_tokens": 8, "concurrency": 1, "hop_stages": stages}
    assert schema.problems({"lanes": {"ring": {"cells": [cell]}}}) == []
