"""Tests of the patch-series checker, then the check of the real series against the real pin.

The small git trees built here are fakes made inside the test; the last test uses the pinned
llama.cpp archive from @llama_cpp and the series in third_party/llama_cpp/patches.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

import patch_series as ps


def _git(cwd, *args):
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
    return subprocess.run(["git", *ps.GIT_IDENTITY, *args], cwd=cwd, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def fake_pin(tmp_path):
    """A two-file fake 'upstream' tree, its archive, its tree hash, and patches made on it."""
    src = tmp_path / "fake-upstream"
    src.mkdir()
    (src / "a.txt").write_text("one\ntwo\nthree\n")
    (src / "b.txt").write_text("alpha\n")
    _git(src, "init", "--quiet")
    _git(src, "add", "--all")
    _git(src, "commit", "--quiet", "-m", "fake pin")
    tree = _git(src, "rev-parse", "HEAD^{tree}")
    archive = tmp_path / "pin.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("a.txt", "b.txt"):
            tar.add(src / name, arcname=name)
    (src / "a.txt").write_text("one\nTWO\nthree\n")
    _git(src, "commit", "--quiet", "-am", "first change")
    (src / "b.txt").write_text("alpha\nbeta\n")
    _git(src, "commit", "--quiet", "-am", "second change")
    out = tmp_path / "patches"
    _git(src, "format-patch", "--quiet", "--zero-commit", "--no-signature", "--no-numbered", "-2", "-o", str(out))
    patches = sorted(out.iterdir())
    return archive, tree, patches


def test_contiguous_names_pass():
    ps.check_names(["0001-a.patch", "0002-b-c.patch", "0003-d.patch"])
    ps.check_names([])


@pytest.mark.parametrize(
    "names",
    [
        ["0001-a.patch", "0003-b.patch"],  # gap
        ["0002-a.patch"],  # does not start at 0001
        ["0001-a.patch", "0001-b.patch"],  # repeat
        ["1-a.patch"],  # not four digits
        ["0001-A.patch"],  # slug not lower case
        ["0001-a.diff"],  # wrong suffix
    ],
)
def test_bad_names_fail(names):
    with pytest.raises(ps.SeriesError):
        ps.check_names(names)


def test_listed_must_equal_directory():
    ps.check_listed_matches_directory(["0001-a.patch"], ["0001-a.patch"])
    with pytest.raises(ps.SeriesError, match="does not list"):
        ps.check_listed_matches_directory(["0001-a.patch"], ["0001-a.patch", "0002-b.patch"])
    with pytest.raises(ps.SeriesError, match="not in patches"):
        ps.check_listed_matches_directory(["0001-a.patch", "0002-b.patch"], ["0001-a.patch"])


def test_series_applies_in_order(fake_pin):
    archive, tree, patches = fake_pin
    assert ps.check_applies(archive, tree, patches) == ["first change", "second change"]


def test_out_of_order_series_fails(fake_pin):
    archive, tree, patches = fake_pin
    (patches[0].parent / "extra").mkdir()
    # The second patch alone applies; applying the first after it conflicts on nothing, so use
    # the first twice: the repeat no longer applies.
    with pytest.raises(ps.SeriesError, match="does not apply"):
        ps.check_applies(archive, tree, [patches[0], patches[0]])


def test_wrong_pin_tree_fails(fake_pin):
    archive, _, patches = fake_pin
    with pytest.raises(ps.SeriesError, match="tree"):
        ps.check_applies(archive, "0" * 40, patches)


def test_real_series_applies_to_the_real_pin():
    listed = [Path(p) for p in os.environ["MESHNET_PATCHES_LISTED"].split()]
    on_disk = [Path(p) for p in os.environ["MESHNET_PATCHES_ON_DISK"].split() if Path(p).name != "README.md"]
    argv = ["--pin-archive", os.environ["MESHNET_PIN_ARCHIVE"], "--pin-tree", os.environ["MESHNET_PIN_TREE"],
            "--listed", *map(str, listed), "--directory", *map(str, on_disk)]
    assert ps.main(argv) == 0
