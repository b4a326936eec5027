"""Refuses a room's library whose modules import a room that python/rooms.bzl does not allow.

Bazel's visibility refuses a `deps` entry across rooms; this refuses the import itself, which
Python would otherwise resolve from whatever else the runfiles hold. `role_library` runs it on
every library's sources as a build action, so `bazel build` fails on a forbidden import.

An import names a room by its second component: `meshnet.tracker.registry` is the tracker room,
`meshnet.process` the shared `process` module, and `meshnet.shard.v1` (a generated protobuf
package) the pseudo-room `shard.v1`. Imports inside functions count like any other.

    check_imports.py --room certify --may-import process,text --out STAMP FILE.py ...
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Iterator


def imported_rooms(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    """(line, module as written, room) for every absolute import of a meshnet module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "meshnet":  # from meshnet import process
                names = [f"meshnet.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "meshnet" or len(parts) < 2:
                continue
            room = parts[1]
            if len(parts) > 2 and parts[2] == "v1":
                room = f"{parts[1]}.v1"
            yield node.lineno, name, room


def violations(room: str, allowed: frozenset[str], path: str, source: str) -> list[str]:
    """One line per import of `path` that `room` may not make."""
    found = []
    for line, name, target in imported_rooms(ast.parse(source, filename=path)):
        if target != room and target not in allowed:
            found.append(f"{path}:{line}: room '{room}' may not import {name} (room '{target}'); "
                         f"python/rooms.bzl allows: {', '.join(sorted(allowed)) or 'nothing'}")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--room", required=True)
    parser.add_argument("--may-import", default="", help="comma-separated rooms and shared modules")
    parser.add_argument("--out", required=True, help="written (the checked files) only when all pass")
    parser.add_argument("sources", nargs="*")
    args = parser.parse_args(argv)
    allowed = frozenset(name for name in args.may_import.split(",") if name)
    found = []
    for path in args.sources:
        found += violations(args.room, allowed, path, Path(path).read_text())
    if found:
        print("\n".join(found), file=sys.stderr)
        return 1
    Path(args.out).write_text("".join(f"{path}\n" for path in args.sources))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
