"""Processes in memory cgroups: a cap on what a process may hold, and what it held at most.

`MemoryCap` is one new cgroup (v1 `memory` or v2) limited to `limit` bytes, swap included where
the kernel accounts it; `prefix` is a command prefix that moves the command into it, so a
process and all its children are charged there (anonymous memory and the page cache it faults
in). `CappedRunner` runs commands one after another, each in a fresh cgroup of the same limit,
and records per command its peak (cgroup charge and VmHWM), time and whether the kernel
OOM-killed it: what certification reports for each of its processes. Caps need root and a
cgroup memory controller; `cgroup_problem` says why not otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

MEMORY_V1 = Path("/sys/fs/cgroup/memory")
UNIFIED = [Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")]


def _v2_root() -> Optional[Path]:
    for root in UNIFIED:
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split():
            return root
    return None


def cgroup_problem() -> Optional[str]:
    """Why processes cannot be capped here, or None when they can."""
    if os.geteuid() != 0:
        return "not root: capping a process's memory needs a cgroup"
    root = MEMORY_V1 if (MEMORY_V1 / "memory.limit_in_bytes").exists() else _v2_root()
    if root is None:
        return "no cgroup memory controller (v1 memory or v2) is mounted"
    if not os.access(root, os.W_OK):
        return f"{root} is not writable here (a sandbox's read-only view of the cgroup tree)"
    return None


class MemoryCap:
    """A new memory cgroup limited to `limit` bytes; `prefix` moves a command into it."""

    def __init__(self, name: str, limit: Optional[int]) -> None:
        """`limit` None: no limit, the group only measures."""
        problem = cgroup_problem()
        if problem:
            raise OSError(problem)
        self.limit = limit
        self.v1 = (MEMORY_V1 / "memory.limit_in_bytes").exists()
        root = MEMORY_V1 if self.v1 else _v2_root()
        self.path = root / f"meshnet-{name}-{os.getpid()}-{time.monotonic_ns()}"
        self.path.mkdir()
        if limit is None:
            pass  # a new group is unlimited
        elif self.v1:
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(limit))
        else:
            (self.path / "memory.max").write_text(str(limit))
            if (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0")
        procs = self.path / "cgroup.procs"
        self.prefix = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs)]

    def peak(self) -> Optional[int]:
        """The most memory the group has been charged (anonymous and page cache)."""
        path = self.path / ("memory.max_usage_in_bytes" if self.v1 else "memory.peak")
        return int(path.read_text()) if path.exists() else None

    def oom_kills(self) -> int:
        text = (self.path / ("memory.oom_control" if self.v1 else "memory.events")).read_text()
        for line in text.splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:  # members still exiting
                time.sleep(0.1)


def evict_from_page_cache(path: Path) -> None:
    """Drops the file's clean pages from the page cache, so the next process that reads them is
    charged for them (a cgroup pays for the page cache it faults in, not for what is cached)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            os.fsync(fd)  # dirty pages are not dropped
        except OSError:  # nothing to write back on a read-only file system
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def peak_rss_bytes(pid: int) -> Optional[int]:
    """VmHWM (peak resident set) of a live process, bytes; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


class RssWatch:
    """Follows a child's VmHWM every `period` seconds until it exits; `peak` is the last value
    read. (wait4's ru_maxrss would be wrong here: it keeps the high-water mark from before
    exec, i.e. the size of the Python parent the child was forked from.)"""

    def __init__(self, pid: int, period: float = 0.05) -> None:
        self.pid, self.period, self.peak = pid, period, 0
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while True:
            value = peak_rss_bytes(self.pid)
            if value is None:
                return
            self.peak = max(self.peak, value)
            time.sleep(self.period)

    def result(self) -> int:
        """The peak, once the process has exited (call after wait())."""
        self._thread.join()
        return self.peak


@dataclasses.dataclass(frozen=True)
class ProcessRecord:
    what: str  # what the process computed ("llama.cpp layers [0, 7)", ...)
    exit_code: int
    seconds: float
    peak_rss_bytes: int  # VmHWM, sampled every 50 ms (a peak held for less may be missed)
    cgroup_peak_bytes: Optional[int]  # what its cgroup was charged at most, exactly (None: no cgroups here)
    oom_killed: bool


class CappedRunner:
    """Runs commands one at a time, each in its own cgroup of `limit` bytes (None: uncapped; in
    an unlimited group that measures it where cgroups are available), and keeps a
    `ProcessRecord` of each in `records`."""

    def __init__(self, limit: Optional[int], name: str = "capped") -> None:
        if limit is not None and limit <= 0:
            raise ValueError(f"a memory cap must be positive, got {limit}")
        self.limit, self.name = limit, name
        self.records: list[ProcessRecord] = []

    def run(self, what: str, command: Sequence[str], timeout: Optional[float] = None,
            reads: Sequence[Path] = ()) -> subprocess.CompletedProcess:
        """The command's CompletedProcess (text output captured); its record is appended. `reads`:
        the files it maps or reads, evicted from the page cache first when capped, so that its
        cgroup is charged for every page of them it touches (as on a machine of its own), not only
        for those no earlier process had cached."""
        for path in reads if self.limit is not None else ():
            evict_from_page_cache(path)
        cap = MemoryCap(self.name, self.limit) if self.limit is not None or cgroup_problem() is None else None
        started = time.monotonic()
        try:
            proc = subprocess.Popen([*(cap.prefix if cap else []), *command], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            watch = RssWatch(proc.pid)
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            oom = cap.oom_kills() > 0 if cap else False
            self.records.append(ProcessRecord(what, proc.returncode, round(time.monotonic() - started, 2),
                                              watch.result(), cap.peak() if cap else None, oom))
        finally:
            if cap:
                cap.remove()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
