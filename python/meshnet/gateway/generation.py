"""One generation for the async gateway: RouteClient.stream on its own thread, read from
asyncio.

`SwarmBackend.start` opens a route through the tracker (as the key's client id) and returns a
`TokenStream`; `await stream.next()` gives the next sampled token, None at the end, or raises
`MeshnetError` (the route could not be opened, or failed past failover). `stream.cancel()` (the
HTTP client went away) sends CANCEL along the chain, so every hop frees the session's KV, and
ends the thread; calling it after the end does nothing.

Threading: the generation thread only puts items on the event loop (call_soon_threadsafe);
everything else happens on the loop. The thread is a daemon: a stuck hop cannot keep the
gateway from exiting.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Optional, Sequence

from meshnet.client.session import GenerationParams, MeshnetError, RouteClient
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.wire import seam as t
from meshnet.wire import tracker as tt
from meshnet.wire.status import Status, StatusCode

_END = object()


class TokenStream:
    def __init__(self, session: RouteClient, prompt_ids: Sequence[int], params: GenerationParams,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.session = session
        # The last hop's finish reason (STOP or LENGTH), known once next() returned the token it
        # came with; None before that and when the generation ended otherwise.
        self.finish_reason: Optional[t.FinishReason] = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = loop
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(list(prompt_ids), params), daemon=True,
                                        name="meshnet-generation")
        self._thread.start()

    def _put(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop closed (gateway shutting down): nobody reads any more
            pass

    def _run(self, prompt_ids: list[int], params: GenerationParams) -> None:
        try:
            for token in self.session.stream(prompt_ids, params):
                self._put((token, self.session.finish_reason))  # set before the last token is yielded
            self._put(_END)
        except MeshnetError as err:
            self._put(err)
        except Exception as err:  # a bug or the tracker unreachable: the request fails, the gateway stays
            self._put(MeshnetError(Status(StatusCode.UNAVAILABLE, f"generation failed: {err!r}")))
        finally:
            self._done.set()

    async def next(self) -> Optional[t.SampledToken]:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # later calls see the end too
            return None
        if isinstance(item, MeshnetError):
            self._queue.put_nowait(item)
            raise item
        token, self.finish_reason = item
        return token

    def cancel(self) -> None:
        if not self._done.is_set():
            self.session.cancel()

    @property
    def failovers(self) -> int:
        return len(self.session.failovers)


class SwarmBackend:
    """Generations through a live swarm, as the gateway role's tracker client."""

    def __init__(self, tracker: TrackerClient, *, insecure: bool = False, max_failovers: int = 3) -> None:
        self.tracker = tracker
        self._insecure = insecure
        self._max_failovers = max_failovers

    def start(self, model: str, client_id: str, prompt_ids: Sequence[int], params: GenerationParams) -> TokenStream:
        session = RouteClient(self.tracker, model, client_id=client_id, max_failovers=self._max_failovers,
                               insecure=self._insecure)
        return TokenStream(session, prompt_ids, params, asyncio.get_running_loop())

    def coverage(self, model: str) -> tt.CoverageReply:
        return self.tracker.coverage(model)
