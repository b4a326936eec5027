"""Issue 30, point 4, on Mesa's software Vulkan (lavapipe) in CI: //python:certify per compute
backend and per mix (ADR 0015), on the seeded tiny Qwen3 fixture (//tools:synthetic_model).

- A mix is refused (exit 2, nothing written) until each of its backends is certified alone.
- `--device cpu`, then `--device vulkan0`: each passes the whole suite on its backend (route
  parity against the same backend's whole model and range chain, 8 concurrent = solo,
  teacher-forced top-1 against Transformers fp32), and the entry keeps both recipes.
- `--device cpu,vulkan0,cpu`: the mixed route's tokens are its mixed range chain's argmax at every
  position, concurrency holds, and the cross-backend agreement (certify/devices.py) passes; the
  entry then names the mix, and a tracker loading it routes that mix.
Lavapipe runs the shaders on the CPU at a few tokens per second whatever the model's size, so the
suite runs here with fewer generated tokens and teacher-forced positions than its defaults (the
same checks; docs/evidence/gpu/ has full-length runs). Nothing here is a speed figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshnet.certify import devices
from meshnet.tracker.main import load_models

TOOLS = os.environ["MESHNET_CERTIFY_TOOLS"].split()
MIX = "cpu,vulkan0,cpu"
TOKENS, POSITIONS = 8, 64  # per prompt; teacher-forced (the suite's defaults: 64 and 256)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    from synthetic_model import DEFAULT_CACHE, build, writable  # tools/synthetic_model.py

    cache = DEFAULT_CACHE if writable(DEFAULT_CACHE) else tmp_path_factory.mktemp("models")
    record = build(cache, 0, Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve(),
                   Path(os.environ["MESHNET_CONVERTER"]).resolve(), None, "qwen3-tiny")
    return Path(record["path"])


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("entries") / "models.json"


def certify(gguf: Path, models: Path, device: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = models.with_name(f"report-{device.replace(',', '-')}.json")
    report.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "meshnet.certify.main", "--gguf", str(gguf), "--model", "qwen3",
                           "--append", str(models), "--report", str(report), "--device", device,
                           "--tokens", str(TOKENS), "--positions", str(POSITIONS), *TOOLS],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                          timeout=1200)
    print(proc.stderr[-4000:] if proc.returncode == 0 else proc.stderr[-20000:])
    return proc, json.loads(report.read_text()) if report.exists() else {}


def test_a_mix_needs_each_backend_certified_alone_first(gguf, models):
    proc, report = certify(gguf, models, MIX)
    assert proc.returncode == 2 and not report and not models.exists()
    assert "no entry for this model in --append" in proc.stderr


@pytest.mark.parametrize("device, backend", [("cpu", "cpu"), ("vulkan0", "vulkan")])
def test_each_backend_alone(gguf, models, device, backend):
    proc, report = certify(gguf, models, device)
    assert proc.returncode == 0 and report["passed"], report.get("checks")
    assert report["devices"] == [device] * 3 and report["compute_backends"] == [backend]
    assert report["route"]["single_process"] and report["route"]["route_equal"]
    assert all(p["teacher_forced"]["equal"] for p in report["route"]["prompts"])
    assert report["route"]["concurrent"]["identical_to_solo"] == 8
    if backend != "cpu":
        assert any("on vulkan0" in p["what"] for p in report["processes"])  # the chains ran there
    [entry] = json.loads(models.read_text())
    recipes = {entry.get("compute_backend", "cpu"): entry["recipe_fingerprint"],
               **{b["compute_backend"]: b["recipe_fingerprint"] for b in entry.get("other_backends", [])}}
    assert backend in recipes and len(set(recipes.values())) == len(recipes)
    assert "mixed_backends" not in entry


def test_the_mix(gguf, models):
    proc, report = certify(gguf, models, MIX)
    assert proc.returncode == 0 and report["passed"], report.get("checks")
    assert not report["route"]["single_process"]  # a mix has no whole-model process: its chain is the reference
    assert all(p["teacher_forced"]["equal"] for p in report["route"]["prompts"])
    assert report["checks"]["cross_backend_agreement"]
    cross = report["cross_backend"]["backends"]
    assert sorted(cross) == ["cpu", "vulkan"]
    assert all(m["top1_agreement"] >= devices.CROSS_BACKEND_TOP1_MIN for m in cross.values())
    [entry] = json.loads(models.read_text())
    assert entry["mixed_backends"]["backends"] == ["cpu", "vulkan"]
    assert entry["mixed_backends"]["certification"]["devices"] == MIX.split(",")
    [model] = load_models(models)
    assert frozenset({"cpu", "vulkan"}) in model.route_combinations()
