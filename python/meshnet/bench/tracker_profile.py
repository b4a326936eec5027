"""`python -m meshnet.bench.tracker_profile --out FILE -- PYTHON -m MODULE ARGS...`: runs MODULE
(the tracker) in this process while a thread samples every thread's stack (tracker_load --profile).

Where the tracker's request threads spend their wall time, by sampling every `--interval-ms`:
waiting for the registry's lock, inside an etcd request (network, etcd, the HTTP client's own
work), waiting for the etcd watch to deliver the tracker's own write, in the work ledger
(SQLite), or elsewhere (gRPC, signatures, routing: running, or waiting for the interpreter lock). Beside it, per sample, whether
some thread holds the registry's lock and what the holder is doing, so "the lock is held across
etcd round trips" becomes a number. Also the CPU seconds of each named thread (/proc, Linux) and
the innermost project functions seen. FILE gets the cumulative counts as JSON once a second and
when MODULE returns (the tracker returns on SIGTERM); a reader diffs two readings for a window.
Measurement only: nothing in the tracker depends on it; sampling costs the sampled process a few
percent of a core.
"""

from __future__ import annotations

import argparse
import collections
import json
import linecache
import os
import re
import runpy
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Optional

WRITE_EVERY_S = 1.0
TOP_FUNCTIONS = 25
_LOCK_LINE = "with self._lock:"


class Sampler:
    """Owns the counters; only its own thread touches them, except `snapshot` (under `_lock`)."""

    def __init__(self, out: Path, interval_s: float) -> None:
        self._out, self._interval = out, interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.samples = 0
        self.handler_states: collections.Counter = collections.Counter()  # thread-samples of request threads
        self.lock_holder: collections.Counter = collections.Counter()  # samples: what the holder does, or "free"
        self.functions: collections.Counter = collections.Counter()  # innermost project frame, running threads
        self._held_cache: dict[tuple[str, int, int], bool] = {}
        self._thread = threading.Thread(target=self._run, name="profile-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._write()

    def _run(self) -> None:
        me = threading.get_ident()
        next_write = time.monotonic() + WRITE_EVERY_S
        while not self._stop.wait(self._interval):
            frames = sys._current_frames()
            with self._lock:
                self.samples += 1
                holder = "free"
                for ident, frame in frames.items():
                    if ident == me:
                        continue
                    stack = _stack(frame)
                    if not any(f.f_code.co_filename.endswith("tracker/service.py") for f in stack):
                        continue  # not serving a request (an idle pool thread, the watch, gRPC's own)
                    state, holding = self._classify(stack)
                    self.handler_states[state] += 1
                    if holding:
                        holder = state
                    if state in ("tracker_code", "registry_under_lock", "ledger"):
                        self.functions[_where(stack)] += 1
                self.lock_holder[holder] += 1
            if time.monotonic() >= next_write:
                self._write()
                next_write = time.monotonic() + WRITE_EVERY_S

    def _classify(self, stack: list[FrameType]) -> tuple[str, bool]:
        """(state, holds the registry lock) of one request thread; stack innermost first."""
        holding = False
        for f in stack:
            if f.f_code.co_filename.endswith("tracker/registry.py") and self._inside_lock(f):
                holding = True
                break
        top = stack[0]
        if top.f_code.co_filename.endswith("tracker/registry.py") and _LOCK_LINE in linecache.getline(
                top.f_code.co_filename, top.f_lineno):
            return "registry_lock_wait", holding
        names = [(f.f_code.co_filename, f.f_code.co_name) for f in stack]
        if any(path.endswith("tracker/store/etcd_client.py") and name == "wait_for" for path, name in names):
            return "etcd_watch_wait", holding
        if any(path.endswith("tracker/store/etcd_client.py") and name == "call" for path, name in names):
            return "etcd_request", holding
        if any("/tracker/ledger" in path for path, _ in names):
            return "ledger", holding  # the work ledger (SQLite: mostly waiting on its commits)
        return ("registry_under_lock" if holding else "tracker_code"), holding

    def _inside_lock(self, frame: FrameType) -> bool:
        """The frame's line is inside a `with self._lock:` block of its function (not on it)."""
        code = frame.f_code
        key = (code.co_filename, code.co_firstlineno, frame.f_lineno)
        if key not in self._held_cache:
            self._held_cache[key] = _inside_block(code.co_filename, code.co_firstlineno, frame.f_lineno)
        return self._held_cache[key]

    def snapshot(self) -> dict:
        with self._lock:
            return {"samples": self.samples, "interval_ms": self._interval * 1000,
                    "request_threads": dict(self.handler_states), "registry_lock": dict(self.lock_holder),
                    "functions": dict(self.functions.most_common(TOP_FUNCTIONS)), "thread_cpu_s": thread_cpu(),
                    "process_cpu_s": round(sum(os.times()[:2]), 2), "at": time.time()}

    def _write(self) -> None:
        tmp = self._out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        tmp.replace(self._out)


def _stack(frame: Optional[FrameType]) -> list[FrameType]:
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    return stack


def _where(stack: list[FrameType]) -> str:
    """The innermost frame of project code, as path-tail:function."""
    for f in stack:
        path = f.f_code.co_filename
        if "/meshnet/" in path and "site-packages" not in path:
            return f"{path.rsplit('/meshnet/', 1)[1]}:{f.f_code.co_name}"
    top = stack[0].f_code
    return f"{top.co_filename.rsplit('site-packages/', 1)[-1]}:{top.co_name}"


def _inside_block(path: str, first: int, line: int) -> bool:
    for start in range(line - 1, first - 1, -1):
        text = linecache.getline(path, start)
        if _LOCK_LINE in text:
            indent = len(text) - len(text.lstrip())
            between = (linecache.getline(path, n) for n in range(start + 1, line + 1))
            return all(len(t) - len(t.lstrip()) > indent for t in between if t.strip())
    return False


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads, summed by Python thread name
    (threads Python does not know, gRPC's own, as "native")."""
    names = {t.native_id: re.sub(r"[-_]\d+", "", t.name) for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = collections.defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        totals[names.get(int(tid), "native")] += (int(fields[11]) + int(fields[12])) / tick
    return {name: round(seconds, 2) for name, seconds in totals.items()}


def main(argv: Optional[list[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if len(command) < 3 or command[1] != "-m":
        parser.error("after --: PYTHON -m MODULE ARGS...")
    sampler = Sampler(args.out, args.interval_ms / 1000)
    sampler.start()
    sys.argv = [command[2], *command[3:]]
    try:
        runpy.run_module(command[2], run_name="__main__", alter_sys=True)
    finally:
        sampler.stop()


if __name__ == "__main__":
    main()
