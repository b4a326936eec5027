"""The client host's program: greedy generations through the swarm, one JSON line per event.

`python generate.py TRACKER CA TOKEN_FILE MODEL TOKENS PROMPT_IDS_JSON...` opens one route per
prompt (a list of token ids) and prints, per prompt: {"event": "route", "hops": [node ids],
"addresses": [...]} once the first token is in, {"event": "token", "i", "token", "t"} per token
(t: seconds since the generation started, this host's clock) and {"event": "done", "tokens",
"failovers", "ttft"}; {"event": "error", ...} if it fails. Run in the client's namespace.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from meshnet.client.session import GenerationParams, MeshnetError, RouteClient
from meshnet.identity.keys import Identity
from meshnet.protocol.tracker_client import TrackerClient


def emit(**event) -> None:
    print(json.dumps(event), flush=True)


def main(argv: list[str]) -> int:
    tracker_address, ca, token_file, model, tokens = argv[:5]
    tracker = TrackerClient(tracker_address, Path(token_file).read_text().strip(), Identity.generate(),
                            tracker_ca=Path(ca).read_bytes())
    for prompt in argv[5:]:
        session = RouteClient(tracker, model)
        got: list[int] = []
        started = time.perf_counter()
        try:
            for token in session.generate(json.loads(prompt), GenerationParams(max_tokens=int(tokens))):
                if not got:
                    hops = session._connection.hops if session._connection else ()
                    emit(event="route", hops=[h.node.node_id for h in hops], addresses=[h.node.address for h in hops])
                got.append(token)
                emit(event="token", i=len(got), token=token, t=time.perf_counter() - started)
        except MeshnetError as err:
            emit(event="error", code=err.status.code.name, message=err.status.message, tokens=got)
            return 1
        emit(event="done", tokens=got, failovers=[node for _, node in session.failovers], ttft=session.ttft)
    tracker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
