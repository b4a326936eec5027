"""Text on top of a token stream: incremental detokenization and stop strings.

`stream_text` wraps any iterator of token ids (e.g. RouteSession.generate) and yields the new
text as it becomes stable; at the first stop string it yields the text before it and stops,
closing the token iterator (which releases the route). Invariant: the concatenated output
equals decode(all tokens consumed) cut at the first stop string.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Sequence


def stream_text(tokens: Iterable[int], decode: Callable[[list[int]], str],
                stop_strings: Sequence[str] = ()) -> Iterator[str]:
    ids: list[int] = []
    emitted = ""
    holdback = max((len(s) for s in stop_strings), default=1) - 1
    iterator = iter(tokens)
    try:
        for token in iterator:
            ids.append(token)
            text = decode(ids)
            cut = min((i for i in (text.find(s) for s in stop_strings if s) if i >= 0), default=-1)
            if cut >= 0:
                if cut > len(emitted):
                    yield text[len(emitted):cut]
                return
            # Hold back what could still become the start of a stop string, and a trailing
            # replacement character (a multi-byte character split across tokens).
            stable = len(text) - holdback
            while stable > len(emitted) and text[stable - 1] == "\ufffd":
                stable -= 1
            if stable > len(emitted):
                yield text[len(emitted):stable]
                emitted = text[:stable]
        text = decode(ids)
        if len(text) > len(emitted):
            yield text[len(emitted):]
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
