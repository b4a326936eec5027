"""What the join tests share: a published swarm's tracker state, its invites, and node processes
started with `--join` and nothing that says what they serve (test-only)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from meshnet.identity.keys import Identity
from meshnet.process import child_env
from meshnet.recipe.certify import uncertified_entry
from meshnet.swarm.local import wait_for_port
from meshnet.tracker.invite_command import main as invite
from meshnet.tracker.publish_command import main as publish
from meshnet.tracker.state_dir import StateDir, init


def published_state(root: Path, gguf: Path, model: str, ranges: Sequence[tuple[int, int]], piece_mib: float,
                    ips: Sequence[str] = ("127.0.0.1",)) -> StateDir:
    """A tracker's state directory (as `tracker --init` makes it) with `gguf` published in `ranges`
    (an entry without the certification suite: the tracker and publish run --allow-uncertified)."""
    state = StateDir(root)
    init(state, ["localhost"], list(ips))
    state.models.write_text(json.dumps([uncertified_entry(gguf, model, "gguf", None, ["cpu"])]))
    assert publish(["--state", str(state.root), "--gguf", str(gguf), "--model", model, "--ranges",
                    ",".join(f"{a}:{b}" for a, b in ranges), "--allow-uncertified", "--piece-mib", str(piece_mib)]) == 0
    return state


def made_invite(state: StateDir, address: str, uses: int) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert invite(["make", "--state", str(state.root), "--role", "node", "--tracker", address,
                       "--uses", str(uses)]) == 0
    return out.getvalue().strip()


class Joiner:
    """A node process started with --join; `prefix` runs it elsewhere (a namespace, a cgroup)."""

    def __init__(self, workdir: Path, name: str, invite_text: str, worker: Path, *extra: str,
                 prefix: Sequence[str] = (), listen: str = "127.0.0.1:0", max_memory: str = "2G") -> None:
        self.data, self.log, self.port_file = workdir / name, workdir / f"{name}.log", workdir / f"{name}.port"
        self.port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "meshnet.node.main", "--join", invite_text, "--data-dir", str(self.data),
             "--max-memory", max_memory, "--worker-binary", str(worker), "--listen", listen,
             "--heartbeat-seconds", "0.5", "--drain-seconds", "2", "--port-file", str(self.port_file), *extra],
            env=child_env(), stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))

    @property
    def node_id(self) -> str:
        return Identity.from_pem((self.data / "identity.pem").read_bytes()).node_id

    def lines(self, event: str) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()
                if line.startswith("{") and f'"event": "{event}"' in line]

    def events(self, step: str) -> list[dict]:
        """The join's log lines of one step (redeemed, assigned, resuming, fetched, ...)."""
        return [json.loads(line) for line in self.log.read_text().splitlines()
                if line.startswith("{") and f'"step": "{step}"' in line]

    def wait_ready(self, timeout: float = 300) -> "Joiner":
        wait_for_port(self.proc, self.port_file, self.log, timeout, f"node {self.data.name}")
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
