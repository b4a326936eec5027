"""Process plumbing shared by every role's main(): JSON-line logs, role tokens, the port file
that tells a launcher where a server listens, the "listening" line shard processes print, and a
stop event set by SIGTERM/SIGINT, and sizes as flags take them."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional


def log(event: str, **fields: Any) -> None:
    """One structured line per event on stderr."""
    print(json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, default=str), file=sys.stderr, flush=True)


def parse_size(text: str) -> int:
    """"1.5G", "1536M", "800K" or a byte count -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 1.5G, 1536M or 1610612736")
    value = int(float(match[1]) * 1024 ** "_KMGT".index(match[2].upper() or "_"))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be positive")
    return value


def cpu_seconds(pid: int) -> Optional[float]:
    """CPU time (user + system, all threads) process `pid` has used so far; None once it is gone.
    Resolution: one clock tick (10 ms on Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_env() -> dict[str, str]:
    """This environment with this interpreter's import path, for `python -m meshnet...` children."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def read_token(token_file: Optional[Path], env: str) -> str:
    """A role token from a file, else from the environment variable `env` ('' if neither)."""
    return token_file.read_text().strip() if token_file else os.environ.get(env, "")


def tracker_token(parser, token_file: Optional[Path], env: str, role: str, tracker_ca: Optional[Path],
                  insecure: bool) -> str:
    """The role's tracker token, after checking the command line can reach the tracker safely
    (a CA to verify it, unless --insecure); exits through `parser.error` otherwise."""
    token = read_token(token_file, env)
    if not token:
        parser.error(f"the {role} role token is required: --token-file or ${env}")
    if tracker_ca is None and not insecure:
        parser.error("--tracker-ca is required (or --insecure for loopback development)")
    return token


def write_port_file(path: Optional[Path], port: int) -> None:
    """Atomically writes the bound port (launchers poll for the file)."""
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.replace(path)


def listening_port(proc: "subprocess.Popen", timeout: float) -> Optional[int]:
    """The port from a child's {"event": "listening", "port": N} stdout line (cpp/worker and
    meshnet.reference.main print one once serving), or None if none came within `timeout`."""
    found: dict[str, int] = {}

    def read() -> None:
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "listening":
                found["port"] = int(event["port"])
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return found.get("port")


def stop_on_signals() -> threading.Event:
    """An event set on SIGTERM or SIGINT; call from the main thread."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def raise_file_limit() -> int:
    """Raises this process's soft limit on open files to its hard limit, and returns it: a
    server's caps on connections are only as good as the descriptors it has (systemd's default
    soft limit is 1,024; issue 55, finding 4). Call once, at start."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on `host` a moment ago (for servers that cannot report theirs)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
