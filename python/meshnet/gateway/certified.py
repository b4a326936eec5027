"""The gateway tokenizes with, and renders the chat template of, only the GGUF its tracker
certified (issue 35, finding 11): a file that is not the certified artifact (another template,
another vocabulary, a template made to exhaust the gateway) is refused before anything is served.

Called by main.py once, before it listens: each `--model NAME=PATH` must be a model the tracker
certified, and PATH's sha256 (recipe.fingerprint, cached by path, size and mtime) must be that
entry's artifact fingerprint, which the tracker's Coverage reply carries. Nothing here runs per
request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import grpc

from meshnet.recipe.fingerprint import artifact_fingerprint
from meshnet.wire import tracker as tt


class CoverageSource(Protocol):
    def coverage(self, model: str, max_nodes: int = 0) -> tt.CoverageReply: ...


def uncertified_models(tracker: CoverageSource, models: Sequence[tuple[str, Path]]) -> list[str]:
    """Why each of `models` (name, GGUF path) may not be served, one line each; [] when all may."""
    problems = []
    for name, path in models:
        try:
            reply = tracker.coverage(name, max_nodes=1)
        except grpc.RpcError as err:
            problems.append(f"model {name!r}: cannot ask the tracker which artifact it certified "
                            f"({err.code().name}: {err.details()})")
            continue
        if reply.status is None or not reply.status.ok or not reply.artifact_fingerprint:
            why = reply.status.message if reply.status is not None and not reply.status.ok else "no certified entry"
            problems.append(f"model {name!r} is not certified on the tracker ({why})")
            continue
        served = artifact_fingerprint(path)
        if served != reply.artifact_fingerprint:
            problems.append(f"model {name!r}: {path} is {served}, but the tracker certified "
                            f"{reply.artifact_fingerprint}; serve the certified file")
    return problems
