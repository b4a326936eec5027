"""The tracker serves only certified models.json entries (//python:certify writes them on a pass)."""

import json

import pytest

from meshnet.tracker.main import load_models, main

ENTRY = {"model": "m", "architecture": "llama", "n_layer": 30, "artifact_fingerprint": "sha256:a",
         "recipe_fingerprint": "sha256:r"}


def test_an_entry_without_a_passed_certification_is_refused(tmp_path):
    path = tmp_path / "models.json"
    for certification in ({}, {"suite": "meshnet-certify-v1", "passed": False}):
        path.write_text(json.dumps([dict(ENTRY, certification=certification)] if certification else [ENTRY]))
        with pytest.raises(SystemExit, match=r"no passed certification for \['m'\].*//python:certify"):
            load_models(path)
        assert [m.model for m in load_models(path, allow_uncertified=True)] == ["m"]


def test_a_certified_entry_is_served(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps([dict(ENTRY, certification={"suite": "meshnet-certify-v1", "passed": True})]))
    (model,) = load_models(path)
    assert model.certification["passed"] is True and model.architecture == "llama"


@pytest.mark.parametrize("flags, message", [
    (["--etcd", "127.0.0.1:2379", "--etcd-ca", "ca.pem"], "go together"),
    (["--etcd-ca", "ca.pem", "--etcd-cert", "c.pem", "--etcd-key", "c.key"], "need --etcd"),
    (["--etcd", "127.0.0.1:2379", "--etcd-ca", "missing.pem", "--etcd-cert", "c.pem", "--etcd-key", "c.key"],
     "is not a readable file"),
    (["--enrolled-roles", "client,node"], "are not enrolled by key"),  # a node's key is its node id
    (["--max-routes-per-principal", "0"], "route quota must be in"),
    (["--failure-reports-per-minute", "0"], "at least 1"),
    (["--route-prefill-grace-seconds", "0"], "positive number of seconds"),
    (["--route-prefill-grace-seconds", "nan"], "positive number of seconds"),
])
def test_flags_are_checked_before_anything_starts(tmp_path, capsys, flags, message):
    (tmp_path / "roles.json").write_text(json.dumps({"node": "n", "client": "c"}))
    with pytest.raises(SystemExit) as exit_:
        main(["--insecure", "--db", str(tmp_path / "ledger.db"), "--listen", "127.0.0.1:0",
              "--roles-file", str(tmp_path / "roles.json"), "--ticket-key", str(tmp_path / "ticket.key"),
              *[str(tmp_path / f) if f.endswith((".pem", ".key")) else f for f in flags]])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
