"""Every field of the seam protocol (proto/meshnet/shard/v1/shard.proto) has code in both
languages: the C++ side (cpp/wire, cpp/protocol, cpp/worker) sets or reads it, and the Python side
(python/meshnet) reads or writes it. A field added to the proto without a codec or a reader on
one side fails here, as does a field on the list of known exceptions once both sides handle it
(the list must shrink with the code). Textual: a C++ accessor (`name()`, `set_name(`,
`add_name(`, `mutable_name(`, `has_name(`, `name_size(`) in a non-test .cc/.h, and a Python
attribute, keyword or field-name string (`.name`, `name=`, `"name"`) in a non-test .py. See the
checklist in proto/meshnet/shard/v1/README.md."""

from __future__ import annotations

import os
import re
from pathlib import Path

from meshnet.shard.v1 import shard_pb2

# (message, field): why one side has no code for it yet.
KNOWN_WITHOUT_PYTHON: dict[tuple[str, str], str] = {}


def _messages(container):
    for message in (container.message_types_by_name.values() if hasattr(container, "message_types_by_name")
                    else container.nested_types):
        yield message
        yield from _messages(message)


def _sources(root: Path, suffixes: tuple[str, ...]) -> str:
    files = [p for p in root.rglob("*") if p.suffix in suffixes and not p.stem.endswith("_test")]
    assert files, f"no sources under {root}"
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def _cpp_sources() -> str:
    files = [Path(p) for p in os.environ["MESHNET_CPP_SOURCES"].split()]
    files = [p for p in files if not p.stem.endswith("_test")]
    assert len(files) > 10, files
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def _python_sources() -> str:
    import meshnet.protocol as protocol  # this room; its parent holds every room in the runfiles
    return _sources(Path(protocol.__file__).resolve().parents[1], (".py",))


def _names_in_cpp(text: str) -> set[str]:
    names = set()
    for name in re.findall(r"\b([a-z_][a-z0-9_]*)\(", text):
        names.add(name)
        for prefix in ("set_", "add_", "mutable_", "has_", "clear_"):
            if name.startswith(prefix):
                names.add(name[len(prefix):])
        if name.endswith("_size"):
            names.add(name[:-len("_size")])
    return names


def _names_in_python(text: str) -> set[str]:
    return set(re.findall(r"\.([a-z_][a-z0-9_]*)\b", text)) | set(re.findall(r"\b([a-z_][a-z0-9_]*)=", text)) | \
        set(re.findall(r"\"([a-z_][a-z0-9_]*)\"", text))


def _fields_without_code() -> dict[tuple[str, str], str]:
    cpp, python = _names_in_cpp(_cpp_sources()), _names_in_python(_python_sources())
    missing = {}
    for message in _messages(shard_pb2.DESCRIPTOR):
        for field in message.fields:
            in_cpp, in_python = field.name in cpp, field.name in python
            if not (in_cpp and in_python):
                missing[(message.name, field.name)] = ("" if in_cpp else "no C++") + ("" if in_python else "no Python")
    return missing


def test_every_field_has_code_in_both_languages_but_the_known_exceptions():
    missing = _fields_without_code()
    unexpected = {k: v for k, v in missing.items() if k not in KNOWN_WITHOUT_PYTHON or v != "no Python"}
    assert not unexpected, f"fields of shard.proto with no code on one side (see the proto's README): {unexpected}"


def test_the_known_exceptions_are_still_exceptions():
    missing = _fields_without_code()
    stale = sorted(set(KNOWN_WITHOUT_PYTHON) - set(missing))
    assert not stale, f"these fields have code on both sides now; remove them from KNOWN_WITHOUT_PYTHON: {stale}"


def test_the_search_finds_a_field_only_one_side_handles(tmp_path, monkeypatch):
    # The check itself can fail: C++ sources that name no field leave every field without C++ code.
    empty = tmp_path / "empty.cc"
    empty.write_text("// nothing\n")
    monkeypatch.setenv("MESHNET_CPP_SOURCES", " ".join([str(empty)] * 11))
    missing = _fields_without_code()
    assert missing[("SeamFrame", "work_id")] == "no C++"
