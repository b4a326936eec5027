"""A real PostgreSQL server in a temporary directory, for the tests of the PostgreSQL ledger (issue 20).

Test harness only (no production code imports it). `PostgresServer` runs Debian's binaries
(`$MESHNET_PG_BINDIR`, else `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin):
`initdb` makes a cluster (superuser `meshnet`, no passwords: a throwaway server that listens on
127.0.0.1 alone, on a free port, with no Unix socket), `postgres` serves it, and the database
`meshnet` is created. `stop` shuts it down cleanly (and `start` brings it back on
the same data), `kill` SIGKILLs it, `teardown` stops it and removes the directory (also when
starting fails). PostgreSQL refuses to run as root: as root (tests under Bazel), initdb and
postgres run in a user namespace of their own (util-linux `unshare`) as the `postgres` user (or
`nobody`), which is our own uid outside it. Setting the uid to `postgres` outright would not do:
Bazel's linux-sandbox runs tests in a user namespace that maps uid 0 alone.
`server_or_skip()` is what a pytest fixture calls: it skips the test, naming the exact reason,
where PostgreSQL is missing or cannot start; it never passes a test silently. The server logs to
<dir>/postgres.log, which the skip reason or a failure quotes the tail of.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

import psycopg

from meshnet.process import free_port

START_TIMEOUT_S = 20.0  # accepting connections
SHARED_MEMORY_IN_USE = "pre-existing shared memory block"  # the postmaster's words when one is still attached
STOP_TIMEOUT_S = 20.0  # a clean (fast) shutdown
SERVER_USERS = ("postgres", "nobody")  # who the server runs as when we are root (the first that exists)
SUPERUSER = "meshnet"
# The server's default: commits acknowledged before their WAL is written, which reaches the disk up
# to 30 s later, so a crash test tells whether a client turned synchronous_commit on for itself.
ASYNC_COMMIT = ("-c", "synchronous_commit=off", "-c", "wal_writer_delay=10000")


def bin_dir() -> Optional[Path]:
    """The directory holding initdb and postgres, or None."""
    candidates = [os.environ.get("MESHNET_PG_BINDIR")]
    try:
        candidates.append(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                         check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        pass
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                         if Path(p).parent.name.isdigit() else 0, reverse=True)
    for candidate in filter(None, candidates):
        if all(os.access(Path(candidate) / tool, os.X_OK) for tool in ("initdb", "postgres")):
            return Path(candidate)
    return None


def _as_another_user() -> list[str]:
    """The command prefix that runs a server we start as root as a user other than root."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RuntimeError("PostgreSQL refuses to run as root, and there is no `unshare` (util-linux) to run it "
                           "as another user")
    for name in SERVER_USERS:
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            continue
        # Maps that user to our own uid: the server owns its files as we do and can do nothing we cannot.
        return [unshare, "--user", f"--map-user={user.pw_uid}", f"--map-group={user.pw_gid}", "--"]
    raise RuntimeError(f"PostgreSQL refuses to run as root, and none of the users {SERVER_USERS} exists to run it as")


class PostgresServer:
    """One server on one data directory. Not thread-safe: the test thread drives it."""

    def __init__(self) -> None:
        binaries = bin_dir()
        if binaries is None:
            raise FileNotFoundError("no PostgreSQL server binaries (install Debian's postgresql, or set "
                                    "MESHNET_PG_BINDIR to the directory holding initdb and postgres)")
        self.bin_dir = binaries
        self._prefix = _as_another_user() if os.geteuid() == 0 else []
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pg-", dir=os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()))
        self._proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        """Where the test database is (what --ledger takes)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/meshnet"

    def __enter__(self) -> "PostgresServer":
        try:
            self._run([str(self.bin_dir / "initdb"), "--pgdata", str(self.dir / "data"), "--username", SUPERUSER,
                       "--auth", "trust", "--encoding", "UTF8", "--no-locale", "--no-sync"])
            self.start()
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute("CREATE DATABASE meshnet")
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    @property
    def admin_url(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def new_schema(self) -> str:
        """The URL of the test database with a new, empty schema of its own first on the search
        path (one per test keeps tests apart; much quicker to make than a database)."""
        name = f"test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return f"{self.url}?options=-csearch_path%3D{name}"

    def _run(self, command: list[str]) -> None:
        done = subprocess.run(self._prefix + command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(command[0]).name} exited with code {done.returncode}: "
                               f"{(done.stdout + done.stderr)[-600:]}")

    def start(self) -> None:
        """Starts the server on its data directory and waits until it accepts connections. Right
        after kill(), a killed backend may hold the old shared memory block a moment longer, and
        the postmaster refuses to start beside it: it is started again until the deadline."""
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError("postgres is already running")
        deadline = time.monotonic() + START_TIMEOUT_S
        launched_at = self._launch()
        while True:
            if self._proc.poll() is not None:
                if SHARED_MEMORY_IN_USE in self._log_since(launched_at) and time.monotonic() < deadline:
                    time.sleep(0.1)
                    launched_at = self._launch()
                    continue
                raise RuntimeError(f"postgres exited (code {self._proc.returncode}): {self.log_tail()}")
            try:
                psycopg.connect(self.admin_url, connect_timeout=1).close()
                return
            except psycopg.OperationalError as err:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres not accepting connections after {START_TIMEOUT_S:g} s ({err}): "
                                       f"{self.log_tail()}") from None
            time.sleep(0.05)

    def _launch(self) -> int:
        """Starts the postmaster; the length its log had before (what this launch writes follows)."""
        log = open(self.dir / "postgres.log", "ab")
        try:
            written = log.seek(0, os.SEEK_END)
            # unshare execs the server: the process we hold is the postmaster.
            self._proc = subprocess.Popen(
                self._prefix + [str(self.bin_dir / "postgres"), "-D", str(self.dir / "data"), "-p", str(self.port),
                                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                                "-c", "max_connections=40", *ASYNC_COMMIT],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        return written

    def _log_since(self, offset: int) -> str:
        with open(self.dir / "postgres.log", "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def stop(self) -> None:
        """A fast shutdown (SIGINT: open transactions roll back, committed data is kept)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILLs the server and its backends (the process group it leads) and reaps it."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def log_tail(self, chars: int = 600) -> str:
        try:
            return (self.dir / "postgres.log").read_text(errors="replace")[-chars:]
        except OSError as err:
            return f"(no log: {err})"

    def teardown(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def server_or_skip() -> PostgresServer:
    """A started server (the caller tears it down), or pytest.skip with the reason it cannot start."""
    import pytest  # test harness only: production code never calls this

    try:
        return PostgresServer().__enter__()
    except (OSError, RuntimeError, psycopg.Error) as err:
        pytest.skip(f"cannot start PostgreSQL: {err}")
        raise  # unreachable: skip raises
