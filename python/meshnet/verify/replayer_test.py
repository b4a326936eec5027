"""A verifier replays an audit only under the recipe its job names: the job's certified artifact
must be the replayer's model and the job's recipe fingerprint the one that recipe gives here.
Every refusal happens before any hop is contacted (run_audit on a job whose hops are unreachable
raises WrongRecipe, not a connection error)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshnet.identity.keys import Identity
from meshnet.recipe.certify import recipe_of
from meshnet.recipe.fingerprint import CACHE_ENV, gguf_summary
from meshnet.recipe.fixtures import write_tiny_llama
from meshnet.verify import audit, commitment, verifier
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, RouteSession


@pytest.fixture
def replayer(tmp_path, monkeypatch) -> audit.Replayer:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "fingerprints.json"))
    gguf = write_tiny_llama(tmp_path / "tiny.gguf")
    return audit.Replayer(Path("/nonexistent/dump_boundaries"), gguf)  # never run: every job here is refused first


def job_for(replayer: audit.Replayer, gguf: Path, matmul_activations: str) -> tt.AuditJob:
    key = Identity.generate()
    node = tt.NodeInfo(key.node_id, "127.0.0.1:1", tt.BackendKind.GGUF, "tiny", "llama", None, "",
                       tt.LayerRange(0, 4), tt.Capacity(1, 64, 0), 4, key.public_key, "")
    recipe = recipe_of(gguf_summary(gguf), "gguf", matmul_activations).fingerprint()
    return tt.AuditJob(1, RouteSession("s", 1), "tiny", (tt.Hop(node, tt.LayerRange(0, 4)),), (),
                       Fingerprints(replayer.artifact, recipe), matmul_activations)


@pytest.mark.parametrize("matmul_activations", ["quantized", "f32"])
def test_the_jobs_recipe_is_the_one_replayed(replayer, tmp_path, matmul_activations):
    job = job_for(replayer, tmp_path / "tiny.gguf", matmul_activations)
    assert replayer.job_matmul_activations(job) == matmul_activations


def test_jobs_of_another_artifact_or_recipe_are_refused_before_any_hop_is_asked(replayer, tmp_path):
    honest = job_for(replayer, tmp_path / "tiny.gguf", "f32")
    wrong = {
        "names no certified": dataclasses.replace(honest, fingerprints=None),
        "names no certified ": dataclasses.replace(honest, matmul_activations=""),
        "certified from": dataclasses.replace(honest, fingerprints=Fingerprints(
            "sha256:" + "0" * 64, honest.fingerprints.runtime_recipe)),
        # the recipe certified with F32 activations, replayed with quantized ones
        "certified recipe is": dataclasses.replace(honest, matmul_activations="quantized"),
        "not in": dataclasses.replace(honest, matmul_activations="int8"),
    }
    for message, job in wrong.items():
        with pytest.raises(audit.WrongRecipe, match=message.strip()):
            replayer.job_matmul_activations(job)
        with pytest.raises(audit.WrongRecipe):  # not grpc's UNAVAILABLE from the hop at 127.0.0.1:1
            verifier.run_audit(job, (replayer, replayer), commitment.Tolerance(1.0, 1, 1.0, 1.0), 4, 0)
    assert replayer.job_matmul_activations(honest) == "f32"  # the refusals changed nothing
