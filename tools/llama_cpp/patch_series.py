"""Checks the llama.cpp patch series: naming, contiguity, the listed-vs-directory match, and
that every patch applies cleanly, in order, to the pinned commit.

Run by //tools/llama_cpp:patch_series_test; usable by hand:
  python3 tools/llama_cpp/patch_series.py --pin-archive PIN.tar.gz --pin-tree TREE \
      --listed 0001-a.patch ... --directory third_party/llama_cpp/patches
Invariant it enforces: patches are NNNN-<slug>.patch numbered 0001, 0002, ... with no gap,
patches.bzl lists exactly the files in patches/, and `git am` applies each to the pin plus the
patches before it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

PATCH_NAME = re.compile(r"^(\d{4})-[a-z0-9][a-z0-9.-]*\.patch$")
GIT_IDENTITY = ["-c", "user.name=meshnet", "-c", "user.email=meshnet@localhost", "-c", "commit.gpgsign=false"]


class SeriesError(Exception):
    """The series breaks one of the rules in the module docstring."""


def check_names(names: Sequence[str]) -> None:
    """Names must be NNNN-slug.patch, numbered 1..N in order without gaps or repeats."""
    for position, name in enumerate(names, start=1):
        match = PATCH_NAME.match(name)
        if not match:
            raise SeriesError(f"{name!r} is not named NNNN-<lowercase-slug>.patch")
        if int(match.group(1)) != position:
            raise SeriesError(f"{name!r} is at position {position}; the series must be numbered 0001, 0002, ... without gaps")


def check_listed_matches_directory(listed: Sequence[str], on_disk: Sequence[str]) -> None:
    missing = sorted(set(listed) - set(on_disk))
    unlisted = sorted(set(on_disk) - set(listed))
    if missing:
        raise SeriesError(f"patches.bzl lists files that are not in patches/: {missing}")
    if unlisted:
        raise SeriesError(f"patches/ has files that patches.bzl does not list: {unlisted}")


def _git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
    proc = subprocess.run(["git", *GIT_IDENTITY, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SeriesError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def check_applies(pin_archive: Path, pin_tree: str, patches: Sequence[Path]) -> list[str]:
    """Applies `patches` with `git am` onto the pinned tree; returns the subjects applied."""
    with tempfile.TemporaryDirectory(prefix="patch-series-") as tmp:
        tree = Path(tmp)
        subprocess.run(["tar", "-xzf", str(pin_archive), "-C", str(tree)], check=True)
        _git(tree, "init", "--quiet")
        _git(tree, "add", "--all", "--force")  # upstream tracks files its .gitignore matches
        actual_tree = _git(tree, "write-tree")
        if actual_tree != pin_tree:
            raise SeriesError(f"the pin archive has tree {actual_tree}, the pin says {pin_tree}")
        _git(tree, "commit", "--quiet", "--allow-empty-message", "-m", "pin")
        subjects = []
        for patch in patches:
            try:
                _git(tree, "am", "--quiet", "--keep-cr", str(Path(patch).resolve()))
            except SeriesError as err:
                raise SeriesError(f"{patch.name} does not apply to the pin plus the patches before it: {err}") from err
            subjects.append(_git(tree, "log", "-1", "--format=%s"))
        return subjects


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pin-archive", type=Path, required=True, help="tar.gz of the pinned commit's tree")
    parser.add_argument("--pin-tree", required=True, help="git tree hash of the pinned commit")
    parser.add_argument("--listed", nargs="*", default=[], type=Path, help="patches.bzl's list, in order")
    parser.add_argument("--directory", nargs="*", default=[], type=Path, help="the *.patch files found in patches/")
    args = parser.parse_args(argv)
    try:
        names = [p.name for p in args.listed]
        check_names(names)
        check_listed_matches_directory(names, [p.name for p in args.directory])
        subjects = check_applies(args.pin_archive, args.pin_tree, args.listed)
    except SeriesError as err:
        print(f"patch series: FAIL: {err}", file=sys.stderr)
        return 1
    print(f"patch series: {len(subjects)} patches apply cleanly to the pin")
    for name, subject in zip(names, subjects):
        print(f"  {name}: {subject}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
