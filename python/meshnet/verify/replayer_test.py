"""A verifier replays an audit only under the recipes its job names: the job's certified artifact
must be the replayer's model, every hop's backend one it replays, and each hop's recipe
fingerprint the one that recipe gives here; each hop is judged at the loosest calibrated
tolerance of the backends its boundary went through (ADR 0015). Every refusal happens before any
hop is contacted (run_audit on a job whose hops are unreachable raises WrongRecipe, not a
connection error). A verifier refuses what it must not judge by (issue 55): a calibration whose
tolerance judges nothing, and a part that is not the bytes its parts record names."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from meshnet.identity.keys import Identity
from meshnet.recipe.certify import recipe_of
from meshnet.recipe.cut_model import cut
from meshnet.recipe.fingerprint import CACHE_ENV, artifact_fingerprint, gguf_summary
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
    assert replayer.plan(job) == audit.ReplayPlan.on_cpu(1, matmul_activations)


def mixed_job(replayer: audit.Replayer, gguf: Path) -> tt.AuditJob:
    """A CPU -> Vulkan -> CPU route of the tiny model, as the tracker hands it out."""
    cpu = job_for(replayer, gguf, "f32")
    hop = cpu.hops[0]
    hops = tuple(tt.Hop(hop.node, tt.LayerRange(a, b)) for a, b in ((0, 1), (1, 3), (3, 4)))
    vulkan = recipe_of(gguf_summary(gguf), "gguf", "quantized", "vulkan").fingerprint()
    recipes = (tt.HopRecipe("cpu", cpu.fingerprints.runtime_recipe, "f32"), tt.HopRecipe("vulkan", vulkan, "quantized"),
               tt.HopRecipe("cpu", cpu.fingerprints.runtime_recipe, "f32"))
    return dataclasses.replace(cpu, hops=hops, hop_recipes=recipes)


def test_each_range_is_replayed_on_its_hops_backend_and_judged_at_its_tolerance(replayer, tmp_path):
    gguf = tmp_path / "tiny.gguf"
    job = mixed_job(replayer, gguf)
    with pytest.raises(audit.WrongRecipe, match="has a hop on vulkan; this verifier replays cpu"):
        replayer.plan(job)
    both = audit.Replayer(Path("/nonexistent/dump_boundaries"), gguf, devices={"cpu": "cpu", "vulkan": "vulkan0"})
    assert both.compute_backends == ("cpu", "vulkan")
    plan = both.plan(job)
    assert plan == audit.ReplayPlan(("cpu", "vulkan", "cpu"), ("cpu", "vulkan0", "cpu"), ("f32", "quantized", "f32"))
    tight, loose = commitment.Tolerance(0.01, 7, 0.1, 0.2), commitment.Tolerance(0.05, 5, 0.3, 0.1)
    # hop 0's boundary went through the CPU only; hops 1 and 2's through Vulkan too
    assert plan.tolerances({"cpu": tight, "vulkan": loose}) == [tight] + [commitment.Tolerance(0.05, 5, 0.3, 0.2)] * 2
    wrong = dataclasses.replace(job, hop_recipes=job.hop_recipes[:1] + (
        tt.HopRecipe("vulkan", job.hop_recipes[0].recipe_fingerprint, "quantized"),) + job.hop_recipes[2:])
    with pytest.raises(audit.WrongRecipe, match="certified recipe is sha256:[0-9a-f]+ on vulkan"):
        both.plan(wrong)
    with pytest.raises(audit.WrongRecipe, match="2 hop recipes for 3 hops"):
        both.plan(dataclasses.replace(job, hop_recipes=job.hop_recipes[:2]))
    with pytest.raises(audit.WrongRecipe, match="no calibrated tolerance for vulkan"):  # before any hop is asked
        verifier.run_audit(job, (both, both), tight, 4, 0)


def test_a_verifier_replays_a_backend_only_with_its_own_calibration(tmp_path):
    cpu, vulkan = tmp_path / "cpu.json", tmp_path / "vulkan.json"
    cpu.write_text('{"tolerance": {"max_value_error": 0.1, "min_overlap": 6, "max_logit_error": 0.2, '
                   '"max_logit_gap": 0.3}}')
    vulkan.write_text('{"compute_backend": "vulkan", "tolerance": {"max_value_error": 0.2, "min_overlap": 5, '
                      '"max_logit_error": 0.4, "max_logit_gap": 0.5}}')
    parser = verifier.argparse.ArgumentParser()
    devices, tolerances = verifier.backends_from_flags(parser, ["vulkan=vulkan0"], [str(cpu), f"vulkan={vulkan}"])
    assert devices == {"cpu": "cpu", "vulkan": "vulkan0"}
    assert tolerances["vulkan"] == commitment.Tolerance(0.2, 5, 0.4, 0.5) and tolerances["cpu"].min_overlap == 6
    for devices_flags, calibrations in ([["vulkan=vulkan0"], [str(cpu)]],  # no Vulkan calibration
                                        [[], [f"vulkan={cpu}"]],  # the CPU's calibration given as Vulkan's
                                        [[], [f"cpu={vulkan}"]],  # and the other way round
                                        [["vulkan"], [str(cpu)]],  # not BACKEND=DEVICE
                                        [["vulkan=cuda0"], [str(cpu), f"vulkan={vulkan}"]],  # another's device
                                        [["metal=metal0"], [str(cpu)]]):  # no such backend
        with pytest.raises(SystemExit) as exited:
            verifier.backends_from_flags(parser, devices_flags, calibrations)
        assert exited.value.code == 2


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
            replayer.plan(job)
        with pytest.raises(audit.WrongRecipe):  # not grpc's UNAVAILABLE from the hop at 127.0.0.1:1
            verifier.run_audit(job, (replayer, replayer), commitment.Tolerance(1.0, 1, 1.0, 1.0), 4, 0)
    assert replayer.plan(honest) == audit.ReplayPlan.on_cpu(1, "f32")  # the refusals changed nothing


def test_a_replay_on_a_gpu_backend_computes_as_the_session_did():
    """On a GPU a prefill of more than 8 rows takes other kernels than decode steps: a plan with a
    GPU hop replays the audited epoch's prefill, then one position per step; a CPU plan, one prefill."""
    mixed = audit.ReplayPlan(("cpu", "vulkan"), ("cpu", "vulkan0"), ("quantized", "quantized"))
    assert mixed.stepwise and not audit.ReplayPlan.on_cpu(2).stepwise
    assert mixed.batch(40, 12) == "12:1" and audit.ReplayPlan.on_cpu(2).batch(40, 12) == "40"
    assert mixed.batch(40, 0) == "40"  # nothing sampled: all of it was prefilled
    tokens = np.array([-1, -1, -1, 7, 9, 4], dtype=np.int32)
    last = audit.HopCommitments("n", (2, 4), 6, None, None, None,
                                commitment.TokenCommitment(tokens, np.zeros(6, np.float16)), 0.0, False,
                                tt.SignedCommitments(b"", b""))
    assert audit.prompt_length([last]) == 4  # position 3's logits gave the first sampled token
    assert audit.prompt_length([dataclasses.replace(last, sampled=None)]) == 0


def test_a_calibration_whose_tolerance_judges_nothing_stops_the_verifier(tmp_path, capsys):
    calibration = tmp_path / "calibration.json"
    for bad, reason in [({"max_value_error": float("nan")}, "max_value_error must be a finite number >= 0, not nan"),
                        ({"max_logit_gap": float("inf")}, "max_logit_gap must be a finite number >= 0, not inf"),
                        ({"min_overlap": -1}, "min_overlap must be a whole number in [1, 8] (of the K=8 committed "
                                              "indices), not -1")]:
        tolerance = {"max_value_error": 0.1, "min_overlap": 6, "max_logit_error": 0.2, "max_logit_gap": 0.3, **bad}
        calibration.write_text(json.dumps({"tolerance": tolerance}))
        with pytest.raises(SystemExit) as exited:
            verifier.backends_from_flags(verifier.argparse.ArgumentParser(), [], [str(calibration)])
        assert exited.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f"error: --calibration {calibration}: {calibration}: tolerance {reason}")


def test_a_part_that_is_not_its_records_bytes_is_never_replayed(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "fingerprints.json"))
    cut(write_tiny_llama(tmp_path / "tiny.gguf"), [(0, 2), (2, 4)], tmp_path / "parts")
    record, part = tmp_path / "parts" / "tiny.parts.json", tmp_path / "parts" / "tiny.layers-0-2.gguf"
    runs = tmp_path / "runs"
    binary = tmp_path / "dump_boundaries"  # stands in for the tool: records that it ran
    binary.write_text(f"#!/bin/sh\necho ran >> {runs}\necho ran on \"$*\" >&2\nexit 1\n")
    binary.chmod(0o755)
    replayer = audit.Replayer(binary, record)
    with pytest.raises(audit.AuditError) as failed:
        replayer.replay([1, 2, 3], [(0, 2), (2, 4)])
    assert str(failed.value).startswith(f"replay failed: dump_boundaries exited 1: ran on {part} ")  # honest: run
    recorded = json.loads(record.read_text())["parts"][0]["sha256"]
    data = bytearray(part.read_bytes())
    data[-1] ^= 0xFF  # a weight's last byte: same size, same header
    part.write_bytes(bytes(data))
    os.utime(part, ns=(part.stat().st_atime_ns, part.stat().st_mtime_ns + 10**9))  # as a later rewrite would
    changed = f"tiny.layers-0-2.gguf (layers [0, 2)) has sha256 {artifact_fingerprint(part)}, not {recorded}"
    with pytest.raises(audit.AuditError) as refused:
        replayer.replay([1, 2, 3], [(0, 2), (2, 4)])
    assert str(refused.value) == f"replay failed: {changed}"
    assert runs.read_text() == "ran\n"  # not run again
    with pytest.raises(ValueError) as refused:  # a verifier started now: --gguf is refused (exit 2)
        audit.Replayer(binary, record)
    assert str(refused.value) == f"{record}: part {changed}"
