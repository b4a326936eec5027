"""The tracker serves only certified models.json entries (//python:certify writes them on a pass)."""

import json

import pytest

from meshnet.tracker.main import load_models

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
