"""Sessions that run beside a lane's measured streams: a hostile client's, for the lanes that
measure what it costs its neighbours (issue 55, finding 7).

Beside(grammar, sessions) opens `sessions` route sessions (a key at its concurrency limit) that
sample under `grammar` on the same last hop as the measured streams, each generating for as long
as it is let and then opening again, until the lane's cells are done. What they achieved (tokens,
sessions, how their sessions ended) is reported with the lane: a hostile session that is refused
or cut is part of the measurement, not a failure of the lane.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Optional

import grpc

from meshnet.client.session import GenerationParams, MeshnetError, RouteClient
from meshnet.protocol.tracker_client import TrackerClient


@dataclasses.dataclass(frozen=True)
class Beside:
    grammar: str  # GBNF each of its tokens continues ("": plain decoding, the load alone)
    sessions: int = 2  # at once: one API key at its concurrency limit (the gateway's default)
    label: str = ""  # what the grammar is, for the report
    max_tokens: int = 192  # per session, before it opens again (prompt and tokens within 256, the least KV a bench session has)
    prompt: tuple[int, ...] = tuple(range(1, 17))  # a short prompt: the cost measured is the grammar's


class BesideSessions:
    """Runs a Beside's sessions in threads between start() and stop(); summary() after."""

    def __init__(self, tracker: TrackerClient, beside: Beside, insecure: bool = False) -> None:
        self._tracker, self._beside, self._insecure = tracker, beside, insecure
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.tokens = 0
        self.opened = 0
        self.endings: collections.Counter = collections.Counter()  # "complete" or the error's code / type
        self.examples: dict[str, str] = {}  # the first message of each ending
        self._started_at: Optional[float] = None
        self._seconds = 0.0

    def start(self) -> None:
        self._started_at = time.perf_counter()
        for i in range(self._beside.sessions):
            thread = threading.Thread(target=self._run, name=f"beside-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=180)
        if self._started_at is not None:
            self._seconds = time.perf_counter() - self._started_at

    def _run(self) -> None:
        params = GenerationParams(max_tokens=self._beside.max_tokens, grammar=self._beside.grammar, ring=True,
                                  route_wait=5.0)
        while not self._stop.is_set():
            session = RouteClient(self._tracker, "bench-model", client_id="beside", insecure=self._insecure)
            with self._lock:
                self.opened += 1
            ending, message = "complete", ""
            try:
                for _ in session.generate(list(self._beside.prompt), params):
                    with self._lock:
                        self.tokens += 1
                    if self._stop.is_set():
                        break
            except MeshnetError as e:
                ending, message = e.status.code.name, e.status.message
            except grpc.RpcError as e:
                ending, message = e.code().name, str(e.details())
            except Exception as e:  # noqa: BLE001 - how a hostile session ended is what is reported
                ending, message = type(e).__name__, str(e)
            with self._lock:
                self.endings[ending] += 1
                self.examples.setdefault(ending, message[:300])
            if ending != "complete":
                self._stop.wait(0.2)  # a refused session opens again, as an attacker's would

    def summary(self) -> dict:
        with self._lock:
            return {"label": self._beside.label, "sessions_at_once": self._beside.sessions,
                    "sessions_opened": self.opened, "tokens": self.tokens,
                    "tok_s": round(self.tokens / self._seconds, 2) if self._seconds else None,
                    "endings": dict(self.endings), "examples": dict(self.examples),
                    "grammar_bytes": len(self._beside.grammar.encode())}
