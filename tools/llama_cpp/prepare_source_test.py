"""prepare_source.sh refuses a broken pin and applies the series as commits.

Each case builds a small fake sdist (a tarball holding a git checkout at vendor/llama.cpp, as
the real llama-cpp-python sdist does) inside the test, then runs the real script on it.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(os.environ["MESHNET_PREPARE_SOURCE"]).resolve()
SUBDIR = "fake-0.0.1/vendor/llama.cpp"
IDENTITY = ["-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]
GIT_ENV = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")


def _git(cwd, *args):
    return subprocess.run(["git", *IDENTITY, *args], cwd=cwd, env=GIT_ENV, check=True,
                          capture_output=True, text=True).stdout.strip()


def _make_sdist(tmp: Path, tamper=None) -> tuple[Path, str, Path]:
    """Returns (sdist tarball, pinned commit, a patch that applies to it)."""
    checkout = tmp / "build" / SUBDIR
    checkout.mkdir(parents=True)
    (checkout / "ggml.c").write_text("int ggml(void) { return 1; }\n")
    _git(checkout, "init", "--quiet")
    _git(checkout, "add", "--all")
    _git(checkout, "commit", "--quiet", "-m", "upstream")
    commit = _git(checkout, "rev-parse", "HEAD")
    (checkout / "ggml.c").write_text("int ggml(void) { return 2; }\n")
    _git(checkout, "commit", "--quiet", "-am", "meshnet: return two")
    patch_dir = tmp / "patches"
    _git(checkout, "format-patch", "--quiet", "--zero-commit", "--no-signature", "-1", "-o", str(patch_dir))
    _git(checkout, "reset", "--quiet", "--hard", commit)
    if tamper:
        tamper(checkout)
    sdist = tmp / "fake-0.0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp / "build" / "fake-0.0.1", arcname="fake-0.0.1")
    return sdist, commit, next(patch_dir.iterdir())


def _run(sdist, commit, dest, level, *patches):
    return subprocess.run(["bash", str(SCRIPT), str(sdist), SUBDIR, commit, str(dest), str(level), *map(str, patches)],
                          capture_output=True, text=True, env=GIT_ENV)


def test_applies_the_series_as_commits(tmp_path):
    sdist, commit, patch = _make_sdist(tmp_path)
    dest = tmp_path / "out"
    proc = _run(sdist, commit, dest, 1, patch)
    assert proc.returncode == 0, proc.stderr
    assert (dest / "ggml.c").read_text() == "int ggml(void) { return 2; }\n"
    assert _git(dest, "log", "-1", "--format=%s") == "meshnet: return two"
    assert _git(dest, "rev-parse", "HEAD~1") == commit
    with tarfile.open(dest / "pin.tar.gz") as tar:
        pristine = tar.extractfile("ggml.c").read().decode()
    assert pristine == "int ggml(void) { return 1; }\n"


def test_level_zero_is_the_pristine_pin(tmp_path):
    sdist, commit, patch = _make_sdist(tmp_path)
    dest = tmp_path / "out"
    proc = _run(sdist, commit, dest, 0, patch)
    assert proc.returncode == 0, proc.stderr
    assert _git(dest, "rev-parse", "HEAD") == commit


def test_wrong_commit_fails_loudly(tmp_path):
    sdist, _, patch = _make_sdist(tmp_path)
    proc = _run(sdist, "1" * 40, tmp_path / "out", 1, patch)
    assert proc.returncode != 0
    assert "pin mismatch" in proc.stderr


def test_modified_file_fails_loudly(tmp_path):
    sdist, commit, patch = _make_sdist(tmp_path, lambda d: (d / "ggml.c").write_text("tampered\n"))
    proc = _run(sdist, commit, tmp_path / "out", 1, patch)
    assert proc.returncode != 0
    assert "is modified" in proc.stderr and "ggml.c" in proc.stderr


def test_extra_file_fails_loudly(tmp_path):
    sdist, commit, patch = _make_sdist(tmp_path, lambda d: (d / "injected.c").write_text("x\n"))
    proc = _run(sdist, commit, tmp_path / "out", 1, patch)
    assert proc.returncode != 0
    assert "is modified" in proc.stderr and "injected.c" in proc.stderr


def test_patch_that_does_not_apply_fails(tmp_path):
    sdist, commit, patch = _make_sdist(tmp_path)
    proc = _run(sdist, commit, tmp_path / "out", 2, patch, patch)
    assert proc.returncode != 0
    assert "does not apply" in proc.stderr


@pytest.mark.parametrize("level", ["2", "-1", "all"])
def test_bad_patch_level_fails(tmp_path, level):
    sdist, commit, patch = _make_sdist(tmp_path)
    proc = _run(sdist, commit, tmp_path / "out", level, patch)
    assert proc.returncode != 0
    assert "patch level" in proc.stderr
