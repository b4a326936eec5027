"""Text on top of a token stream: incremental detokenization and stop strings.

`IncrementalText` takes token ids one at a time and says what new text is stable (it cannot
change with later tokens) and whether a stop string has completed; `stream_text` wraps any
iterator of token ids (e.g. RouteClient.generate) with it, yields the new text as it becomes
stable, and at the first stop string yields the text before it and stops, closing the token
iterator (which releases the route). Invariant: the concatenated output equals
decode(all tokens consumed) cut at the first stop string.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Sequence


class IncrementalText:
    """One generation's text; not thread-safe (one feeder)."""

    def __init__(self, decode: Callable[[list[int]], str], stop_strings: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stops = [s for s in stop_strings if s]
        self._holdback = max((len(s) for s in self._stops), default=1) - 1
        self.ids: list[int] = []
        self.emitted = ""
        self.stopped = False  # a stop string completed: feed no more

    def feed(self, token: int) -> str:
        """Adds a token; returns the text that became stable (maybe ""). At a stop string, the
        text before it, and `stopped` turns true."""
        self.ids.append(token)
        text = self._decode(self.ids)
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._emit(text[:cut])
        # Hold back what could still become the start of a stop string, and a trailing
        # replacement character (a multi-byte character split across tokens).
        stable = len(text) - self._holdback
        while stable > len(self.emitted) and text[stable - 1] == "\ufffd":
            stable -= 1
        return self._emit(text[:stable])

    def finish(self) -> str:
        """The rest of the text once no token follows (nothing after a stop string)."""
        return "" if self.stopped else self._emit(self._decode(self.ids))

    def _emit(self, upto: str) -> str:
        if len(upto) <= len(self.emitted):
            return ""
        piece = upto[len(self.emitted):]
        self.emitted = upto
        return piece


def stream_text(tokens: Iterable[int], decode: Callable[[list[int]], str],
                stop_strings: Sequence[str] = ()) -> Iterator[str]:
    text = IncrementalText(decode, stop_strings)
    iterator = iter(tokens)
    try:
        for token in iterator:
            piece = text.feed(token)
            if piece:
                yield piece
            if text.stopped:
                return
        piece = text.finish()
        if piece:
            yield piece
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
