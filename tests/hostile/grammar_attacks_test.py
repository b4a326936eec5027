"""Issue 55, findings 1, 2, 6 and 8, against real processes: grammars written to hurt a last hop,
sent by a client-role ticket holder through a live 2-node GGUF swarm (tracker, nodes, native
workers, TLS, tickets), while an honest client generates beside them.

- groups nested 17,500 deep (35 KB) crashed the last hop's worker (stack overflow), and the
  fourth crash ended its node;
- a recursive alternative of 64 arrays wedged the last hop's threads for good;
- a long literal repeated 2000 times cost the last hop 2 GB;
- a refused 256 KiB grammar was written to the worker's log whole.

Each is now refused INVALID_ARGUMENT naming its bound (patch 0013), no worker crashes or restarts,
the log grows by a short line per refusal, no thread stays busy once the attacks stop, and the
honest client's tokens equal its tokens alone. And a 6 KB grammar within every such bound whose
masking takes time exponential in a token's length (more than a minute a draw before) ends its
session RESOURCE_EXHAUSTED at the last hop's sampling budget (patch 0014), as quickly.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import psutil
import pytest

from meshnet.client.session import GenerationParams, MeshnetError, RouteClient
from meshnet.gateway.grammar.worst_cases import EXPONENTIAL_GBNF
from meshnet.swarm.local import LocalSwarm
from meshnet.wire.status import StatusCode

GGUF = Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()
WORKER = Path(os.environ["MESHNET_WORKER_BINARY"]).resolve()
CUTS = [(0, 15), (15, 30)]
PROMPT = [1, 504, 3458, 282, 4649, 314]  # "The capital of France is" in SmolLM2's vocabulary
MAX_GRAMMAR_BYTES = 256 << 10


def nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"x"' + ")" * depth


def ambiguous_arrays() -> str:
    """64 alternatives that each open an array of the same value: each '[' multiplies the stacks by 64."""
    names = [f"a{i}" for i in range(64)]
    return "root ::= v\nv ::= " + " | ".join(names) + "\n" + "".join(f'{n} ::= "[" v? "]"\n' for n in names)


ATTACKS = {
    "nesting_17500": (nested(17500), "nested deeper than 1024 levels"),
    "ambiguous_arrays": (ambiguous_arrays(), "more than 1024 parse stacks"),
    "literal_repeated_2000": ('root ::= "' + "a" * 32000 + '"{2000}', "repetitions expand past"),
    "refused_256_kib": ("root ::= [" + "a" * (MAX_GRAMMAR_BYTES - 16), "unexpected end of input"),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("grammar-attacks")


@pytest.fixture(scope="module")
def swarm(workdir):
    with LocalSwarm(workdir, GGUF, CUTS, backend="gguf", worker_binary=WORKER, max_sessions=8) as s:
        yield s


def workers(swarm) -> dict[str, psutil.Process]:
    return {node_id: psutil.Process(node.proc.pid).children()[0] for node_id, node in swarm.nodes.items()}


def worker_logs_size(workdir: Path) -> int:
    """Bytes in the workers' logs (each node writes its worker's stderr to NAME.worker.log)."""
    logs = list(workdir.glob("*.worker.log"))
    assert len(logs) == len(CUTS), logs
    return sum(p.stat().st_size for p in logs)


def attack(tracker, swarm, grammar: str) -> MeshnetError:
    with pytest.raises(MeshnetError) as refused:
        list(RouteClient(tracker, swarm.model).generate(PROMPT, GenerationParams(max_tokens=8, grammar=grammar)))
    return refused.value


HONEST = GenerationParams(max_tokens=24)


@contextlib.contextmanager
def honest_beside(tracker, swarm):
    """An honest client generating over and over while the block runs; yields its runs and its
    tokens alone (asserted equal to every run afterwards)."""
    solo = list(RouteClient(tracker, swarm.model).generate(PROMPT, HONEST))
    assert len(solo) == 24
    honest: list[list[int]] = []
    stop = threading.Event()

    def generate_honestly() -> None:
        while not stop.is_set():
            honest.append(list(RouteClient(tracker, swarm.model).generate(PROMPT, HONEST)))

    beside = threading.Thread(target=generate_honestly)
    beside.start()
    try:
        yield honest
    finally:
        stop.set()
        beside.join(timeout=120)
    assert honest and all(run == solo for run in honest), (len(honest), honest[:2])


def assert_idle_and_unharmed(tracker, swarm, before: dict[str, psutil.Process]) -> None:
    """No worker crashed, none keeps a core busy once the attacks stop, and a client is served."""
    after = workers(swarm)
    assert {n: p.pid for n, p in after.items()} == {n: p.pid for n, p in before.items()}  # none crashed
    cpu = {n: p.cpu_times() for n, p in after.items()}
    time.sleep(2.0)
    for n, p in after.items():
        spent = sum(p.cpu_times()[:2]) - sum(cpu[n][:2])
        assert spent < 0.3, (n, spent)
    assert len(list(RouteClient(tracker, swarm.model).generate(PROMPT, HONEST))) == 24


def test_hostile_grammars_are_refused_beside_an_honest_client(swarm, workdir):
    with swarm.client() as tracker:
        before, log_before = workers(swarm), worker_logs_size(workdir)
        refusals = 0
        with honest_beside(tracker, swarm):
            for name, (grammar, reason) in ATTACKS.items():
                for _ in range(4):  # four crashes ended a node before
                    refused = attack(tracker, swarm, grammar)
                    assert refused.status.code == StatusCode.INVALID_ARGUMENT, (name, refused.status)
                    assert reason in refused.status.message, (name, refused.status.message[:400])
                    assert len(refused.status.message) < 1024, name
                    refusals += 1
        # A short line or two per refusal, never the grammar's text (524,336 bytes each before).
        grown = worker_logs_size(workdir) - log_before
        assert grown < refusals * 256, grown
        assert_idle_and_unharmed(tracker, swarm, before)


def test_a_draw_that_would_take_minutes_ends_at_the_sampling_budget(swarm):
    grammar = EXPONENTIAL_GBNF
    assert len(grammar) < 8192
    with swarm.client() as tracker:
        before = workers(swarm)
        with honest_beside(tracker, swarm):
            for _ in range(4):
                started = time.monotonic()
                refused = attack(tracker, swarm, grammar)
                assert refused.status.code == StatusCode.RESOURCE_EXHAUSTED, refused.status
                assert "sampling budget" in refused.status.message, refused.status.message[:400]
                assert time.monotonic() - started < 30  # the budget is 1 s of CPU a draw
        assert_idle_and_unharmed(tracker, swarm, before)
