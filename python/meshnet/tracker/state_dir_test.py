"""Issue 50, item 1: a tracker made in one command. `--init DIR` makes every file a tracker needs
(owner-only), serves and prints its address and certificate SHA-256; `--state DIR` serves the
same files again; nothing is replaced without --force. The last test runs the real tracker
process twice and has a node and a client use the made files over TLS."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from meshnet.identity.keys import Identity
from meshnet.identity.roles import ROLES
from meshnet.process import child_env
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.main import main
from meshnet.tracker.state_dir import StateDir, certificate_names, certificate_sha256, init

NAMES = (["localhost"], ["127.0.0.1"])


def test_init_makes_every_file_readable_by_its_owner_only(tmp_path):
    state = StateDir(tmp_path / "tracker")
    assert init(state, *NAMES) == []
    assert state.missing() == []
    assert state.root.stat().st_mode & 0o777 == 0o700
    for path in state.files():
        assert path.stat().st_mode & 0o777 == 0o600, path
    roles = json.loads(state.roles.read_text())
    assert sorted(roles) == sorted(ROLES) and len(set(roles.values())) == len(ROLES)
    Identity.from_pem(state.ticket_key.read_bytes())
    assert certificate_sha256(state.tls_cert.read_bytes()).startswith("sha256:")
    assert json.loads(state.models.read_text()) == []
    Ledger(state.ledger).close()


def test_init_replaces_nothing_without_force(tmp_path):
    state = StateDir(tmp_path)
    init(state, *NAMES)
    before = {path: path.read_bytes() for path in state.files() if path != state.ledger}
    with pytest.raises(FileExistsError, match=r"roles\.json.*already exist: serve them with --state"):
        init(state, *NAMES)
    assert {path: path.read_bytes() for path in before} == before
    assert init(state, *NAMES, force=True) == list(state.files())
    assert state.roles.read_bytes() != before[state.roles]
    assert state.tls_cert.read_bytes() != before[state.tls_cert]


def test_one_existing_file_is_enough_to_refuse(tmp_path):
    (tmp_path / "roles.json").write_text("{}")
    with pytest.raises(FileExistsError, match="roles.json already exist"):
        init(StateDir(tmp_path), *NAMES)
    assert not (tmp_path / "tls_cert.pem").exists()


def test_certificate_names_leave_out_wildcards_and_keep_what_is_advertised():
    dns, ips = certificate_names("0.0.0.0", ["tracker.example", "192.0.2.7"])
    assert "tracker.example" in dns and "localhost" in dns
    assert "192.0.2.7" in ips and "127.0.0.1" in ips and "0.0.0.0" not in ips


@pytest.mark.parametrize("flags, message", [
    (["--state", "{dir}"], "not a tracker's state directory, missing roles.json, ticket_key.pem"),
    (["--init", "{dir}", "--insecure"], "--insecure is for hand-made loopback swarms"),
    (["--force"], "--force goes with --init"),
    (["--init", "{dir}", "--state", "{dir}"], "not allowed with argument"),
    ([], "--roles-file, --ticket-key and --db (or --ledger) are required, or --init DIR makes them"),
])
def test_state_flags_are_checked_before_anything_starts(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        main(["--listen", "127.0.0.1:0", *[f.format(dir=tmp_path) for f in flags]])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def start(flags: list[str]) -> tuple[subprocess.Popen, list[str]]:
    """The tracker process, and the three lines it prints once listening."""
    proc = subprocess.Popen([sys.executable, "-m", "meshnet.tracker.main", "--listen", "127.0.0.1:0", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=child_env())
    lines = [proc.stdout.readline().strip() for _ in range(3)]
    return proc, lines


def test_a_tracker_made_in_one_command_serves_and_serves_again_from_its_state(tmp_path):
    state = StateDir(tmp_path / "tracker")
    proc, lines = start(["--init", str(state.root)])
    try:
        port = int(lines[0].rpartition(":")[2])
        sha = certificate_sha256(state.tls_cert.read_bytes())
        assert lines == [f"tracker listening on 127.0.0.1:{port}", f"certificate {sha}", f"state {state.root}"]
        roles, ca = json.loads(state.roles.read_text()), state.tls_cert.read_bytes()
        key = Identity.generate()
        with TrackerClient(f"127.0.0.1:{port}", roles["node"], key, tracker_ca=ca, timeout=10) as node:
            assert not node.heartbeat(key.node_id).status.ok  # served: the node is not registered
        with TrackerClient(f"127.0.0.1:{port}", roles["client"], Identity.generate(), tracker_ca=ca) as client:
            assert client.coverage("absent").routable_count == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    again, lines = start(["--state", str(state.root)])
    try:
        port = int(lines[0].rpartition(":")[2])
        assert lines[1] == f"certificate {sha}"  # the same certificate, so pins and invites still hold
        with TrackerClient(f"127.0.0.1:{port}", roles["client"], Identity.generate(), tracker_ca=ca) as client:
            assert client.coverage("absent").routable_count == 0
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=30) == 0
