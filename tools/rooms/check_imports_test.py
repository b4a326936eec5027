"""The import fence refuses what python/rooms.bzl forbids, with the file, line and room."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import check_imports

ROOMS_BZL = "python/rooms.bzl"


def rooms_table() -> dict:
    """python/rooms.bzl's ROOMS, read as the build reads it (Starlark's subset here is Python)."""
    runfiles = Path(os.environ.get("TEST_SRCDIR", ".")) / os.environ.get("TEST_WORKSPACE", "")
    path = runfiles / ROOMS_BZL if (runfiles / ROOMS_BZL).exists() else Path(__file__).parents[2] / ROOMS_BZL
    scope = {"struct": types.SimpleNamespace}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    return scope["ROOMS"]


def run_fence(tmp_path: Path, room: str, source: str) -> subprocess.CompletedProcess:
    module = tmp_path / "module.py"
    module.write_text(source)
    allowed = ",".join(rooms_table()[room].imports)
    return subprocess.run(
        [sys.executable, check_imports.__file__, "--room", room, "--may-import", allowed,
         "--out", str(tmp_path / "stamp"), str(module)],
        capture_output=True, text=True, check=False)


def test_certification_may_not_import_the_bench(tmp_path):
    done = run_fence(tmp_path, "certify", "import json\n\nfrom meshnet.bench.lanes import LANES\n")
    assert done.returncode == 1
    assert f"{tmp_path / 'module.py'}:3: room 'certify' may not import meshnet.bench.lanes (room 'bench')" in done.stderr
    assert not (tmp_path / "stamp").exists()


def test_an_import_inside_a_function_counts(tmp_path):
    done = run_fence(tmp_path, "text", "def late():\n    from meshnet.gateway import api\n    return api\n")
    assert done.returncode == 1
    assert "module.py:2: room 'text' may not import meshnet.gateway (room 'gateway')" in done.stderr


def test_generated_protobuf_is_its_own_room(tmp_path):
    done = run_fence(tmp_path, "gateway", "from meshnet.shard.v1 import shard_pb2\n")
    assert done.returncode == 1
    assert "(room 'shard.v1')" in done.stderr


def test_allowed_imports_pass_and_leave_the_stamp(tmp_path):
    source = "from meshnet.certify.prompts import BENCH_TEXT\nfrom meshnet.bench import harness\nimport meshnet.process\n"
    done = run_fence(tmp_path, "bench", source)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "stamp").read_text() == f"{tmp_path / 'module.py'}\n"


def test_the_table_has_no_unknown_rooms_and_certify_never_reaches_the_bench():
    table = rooms_table()
    shared = {"process", "memory_cap", "http_bounds", "peers", "webserver"}
    for room, rules in table.items():
        for name in list(rules.imports) + list(rules.test_imports):
            assert name in table or name in shared or name.endswith(".v1"), (room, name)
    assert "bench" not in table["certify"].imports + table["certify"].test_imports
    assert "certify" in table["bench"].imports
