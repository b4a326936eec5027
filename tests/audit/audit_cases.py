"""What the audit tests share: the bundled model, its tokenizer, the replay tool and the
calibrated tolerance (from the environment the BUILD file sets), and a cheaper quantization of the
model for the substitution cheat."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from meshnet.text.tokenizer import GgufTokenizer
from meshnet.verify import audit, commitment


@pytest.fixture(scope="module")
def gguf() -> Path:
    return Path(os.environ["MESHNET_BUNDLED_GGUF"]).resolve()


@pytest.fixture(scope="module")
def tokenizer(gguf):
    return GgufTokenizer.from_gguf(gguf)


@pytest.fixture(scope="module")
def replayers(gguf):
    """The verifier's two replays: the first, and the one that confirms a refutation."""
    binary = Path(os.environ["MESHNET_DUMP_BOUNDARIES"])
    return audit.Replayer(binary, gguf, threads=2), audit.Replayer(binary, gguf, threads=1)


@pytest.fixture(scope="module")
def tolerance():
    return commitment.tolerance_from_calibration(os.environ["MESHNET_CALIBRATION"])


@pytest.fixture(scope="module")
def q4_0(gguf, tmp_path_factory) -> Path:
    """The bundled Q4_1 model requantized to Q4_0: what a node cutting corners might serve."""
    out = tmp_path_factory.mktemp("q4_0") / "q4_0.gguf"
    subprocess.run([os.environ["MESHNET_QUANTIZE"], "--allow-requantize", str(gguf), str(out), "Q4_0"], check=True,
                   capture_output=True)
    return out
