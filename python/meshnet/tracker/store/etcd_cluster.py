"""A real 3-member etcd cluster on loopback ports, for the tests of the etcd tracker store (issue 20).

Test harness only (no production code imports it). `EtcdCluster` starts `etcd` members (Debian's
etcd-server, /usr/bin/etcd, or `$MESHNET_ETCD`) with client and peer URLs on 127.0.0.1 and data
directories under one temporary directory, waits until every member reports healthy, can SIGKILL
and restart one member, and tears everything down on exit (also when starting fails).
`cluster_or_skip()` is what a pytest fixture calls: it skips the test, naming the exact reason,
where etcd is missing or cannot start; it never passes a test silently. Each member logs to
<data dir>.log, which the skip reason or a failure quotes the tail of.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Optional

from meshnet.tracker.store.etcd_client import EtcdClient, EtcdTls

START_TIMEOUT_S = 20.0  # all members healthy
HEALTH_TIMEOUT_S = 1.0  # one /health request


def etcd_binary() -> Optional[str]:
    return os.environ.get("MESHNET_ETCD") or shutil.which("etcd") or (
        "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdCluster:
    """`members` etcd processes forming one cluster. Not thread-safe: the test thread drives it."""

    def __init__(self, members: int = 3, base_dir: Optional[Path] = None, tls: bool = False) -> None:
        """`tls`: client URLs on https, every client required to show a certificate the cluster's
        own CA signed (etcd's --client-cert-auth); `self.tls` is then what a client needs, and
        `stranger_tls` a well-formed client certificate from another CA (refused)."""
        binary = etcd_binary()
        if binary is None:
            raise FileNotFoundError("no etcd binary (install Debian's etcd-server, or set MESHNET_ETCD)")
        self.binary = binary
        root = base_dir or Path(os.environ.get("TEST_TMPDIR") or tempfile.gettempdir())
        self.dir = Path(tempfile.mkdtemp(prefix="etcd-", dir=root))
        self.tls: Optional[EtcdTls] = None
        self.stranger_tls: Optional[EtcdTls] = None
        if tls:
            self.tls, self.stranger_tls = _tls_files(self.dir / "tls")
        self.names = [f"m{i}" for i in range(members)]
        self.client_ports = [free_port() for _ in self.names]
        self.peer_ports = [free_port() for _ in self.names]
        self._token = f"meshnet-{uuid.uuid4().hex[:12]}"
        self._procs: list[Optional[subprocess.Popen]] = [None] * members

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoints(self) -> list[str]:
        """host:port of every member's client URL (what --etcd takes, comma-joined)."""
        return [f"127.0.0.1:{port}" for port in self.client_ports]

    def __enter__(self) -> "EtcdCluster":
        try:
            for i in range(len(self.names)):
                self.start(i)
            self.wait_healthy(range(len(self.names)))
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _command(self, i: int) -> list[str]:
        peers = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports))
        client = f"{self.scheme}://127.0.0.1:{self.client_ports[i]}"
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        # The initial-cluster flags are ignored once the data directory exists (a restart).
        command = [self.binary, "--name", self.names[i], "--data-dir", str(self.dir / self.names[i]),
                   "--listen-client-urls", client, "--advertise-client-urls", client,
                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                   "--initial-cluster", peers, "--initial-cluster-state", "new",
                   "--initial-cluster-token", self._token,
                   "--experimental-watch-progress-notify-interval", "1s"]
        if self.tls:
            folder = self.tls.ca.parent
            command += ["--cert-file", str(folder / "server.pem"), "--key-file", str(folder / "server.key"),
                        "--client-cert-auth", "--trusted-ca-file", str(self.tls.ca)]
        return command

    def start(self, i: int) -> None:
        """Starts member i (again, after kill(i): it rejoins with its data directory)."""
        if self._procs[i] is not None and self._procs[i].poll() is None:
            raise RuntimeError(f"etcd member {self.names[i]} is already running")
        log = open(self.dir / f"{self.names[i]}.log", "ab")
        try:
            self._procs[i] = subprocess.Popen(self._command(i), stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()

    def kill(self, i: int) -> None:
        """SIGKILLs member i (no clean shutdown) and reaps it."""
        proc = self._procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def leader(self) -> int:
        """The index of the member that leads the cluster now (asked of the cluster itself)."""
        client = EtcdClient(self.endpoints, tls=self.tls)
        leader = client.post("/maintenance/status", {})["leader"]
        names = {m["ID"]: m["name"] for m in client.post("/cluster/member/list", {})["members"]}
        return self.names.index(names[leader])

    def healthy(self, i: int) -> bool:
        url = f"{self.scheme}://127.0.0.1:{self.client_ports[i]}/health"
        context = None
        if self.tls:
            context = ssl.create_default_context(cafile=str(self.tls.ca))
            context.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        try:
            with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S, context=context) as reply:
                return json.loads(reply.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def wait_healthy(self, members, timeout: float = START_TIMEOUT_S) -> None:
        """Waits until every member in `members` answers /health true; raises RuntimeError (with
        the tails of their logs) when one exits or the time runs out."""
        deadline = time.monotonic() + timeout
        waiting = list(members)
        while waiting:
            for i in list(waiting):
                proc = self._procs[i]
                if proc is None or proc.poll() is not None:
                    code = None if proc is None else proc.returncode
                    raise RuntimeError(f"etcd member {self.names[i]} exited (code {code}): {self.log_tail(i)}")
                if self.healthy(i):
                    waiting.remove(i)
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"etcd members {[self.names[i] for i in waiting]} not healthy after {timeout:g} s: "
                                   f"{self.log_tail(waiting[0])}")
            if waiting:
                time.sleep(0.05)

    def log_tail(self, i: int, chars: int = 600) -> str:
        try:
            return (self.dir / f"{self.names[i]}.log").read_text(errors="replace")[-chars:]
        except OSError as err:
            return f"(no log: {err})"

    def teardown(self) -> None:
        for i in range(len(self._procs)):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)


def _tls_files(folder: Path) -> tuple[EtcdTls, EtcdTls]:
    """A CA, the members' server certificate (127.0.0.1 and localhost), a client certificate it
    signed, and one signed by another CA: (client TLS, stranger's TLS)."""
    from meshnet.identity.certificates import issued, self_signed  # cryptography, only when asked
    from meshnet.identity.tls import write_private

    folder.mkdir(mode=0o700)
    ca_pem, ca_key = self_signed("meshnet etcd test CA")
    (folder / "ca.pem").write_bytes(ca_pem)
    server_pem, server_key = issued(ca_pem, ca_key, "etcd", ["localhost"], ["127.0.0.1"])
    (folder / "server.pem").write_bytes(server_pem)
    write_private(folder / "server.key", server_key)
    files = []
    for name, (signer_pem, signer_key) in (("tracker", (ca_pem, ca_key)),
                                           ("stranger", self_signed("another CA"))):
        cert_pem, key_pem = issued(signer_pem, signer_key, name)
        (folder / f"{name}.pem").write_bytes(cert_pem)
        write_private(folder / f"{name}.key", key_pem)
        files.append(EtcdTls(folder / "ca.pem", folder / f"{name}.pem", folder / f"{name}.key"))
    return files[0], files[1]


def cluster_or_skip(members: int = 3, tls: bool = False) -> EtcdCluster:
    """A started cluster (the caller tears it down), or pytest.skip with the reason it cannot start."""
    import pytest  # test harness only: production code never calls this

    try:
        return EtcdCluster(members, tls=tls).__enter__()
    except (OSError, RuntimeError) as err:
        pytest.skip(f"cannot start a {members}-member etcd cluster: {err}")
        raise  # unreachable: skip raises
