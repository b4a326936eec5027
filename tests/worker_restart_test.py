"""A GGUF node restarts its worker when the worker dies, within --max-restarts over
--restart-window-seconds, and gives up past them (issue 55, finding 1). A real node over the
bundled model: its worker is killed with SIGKILL; the node restarts it, registers again and
serves a generation equal to single-process llama.cpp's; killed a second time within the
window of one restart, the node exits 1 saying why."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from meshnet.swarm.local import LocalSwarm
from route_cases import PROMPTS, generate, llama_cpp_greedy, tokenizer, tracker  # noqa: F401 - fixtures

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
GREEDY = Path(os.environ["MESHNET_GREEDY_BINARY"]).resolve()
TOKENS = 16


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    with LocalSwarm(tmp_path_factory.mktemp("restart"), GGUF, [(0, 30)], backend="gguf", worker_binary=WORKER,
                    max_sessions=2, node_args=["--max-restarts", "1", "--restart-window-seconds", "600"]) as s:
        yield s


def worker_pid(node_pid: int) -> int:
    children = [int(c) for task in Path(f"/proc/{node_pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    (pid,) = [c for c in children if Path(f"/proc/{c}/exe").resolve().name.startswith("worker")]
    return pid


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_dead_worker_is_restarted_once_then_the_node_gives_up(swarm, tracker, tokenizer):
    (node,) = swarm.nodes.values()
    first = worker_pid(node.proc.pid)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: '"worker_restart"' in node.log.read_text(), 60, "the node did not restart its worker")
    wait_for(lambda: tracker.coverage("smollm2").routable_count == 1, 120, "the node did not register again")
    assert worker_pid(node.proc.pid) != first
    prompt = PROMPTS[0]
    assert generate(tracker, tokenizer, prompt, TOKENS) == llama_cpp_greedy(
        GREEDY, GGUF, tokenizer(prompt)["input_ids"], TOKENS)
    os.kill(worker_pid(node.proc.pid), signal.SIGKILL)  # a second death within the window of one restart
    assert node.proc.wait(timeout=60) == 1
    assert '"worker_failed"' in node.log.read_text()
