"""The layer-range adapters of the patched llama.cpp, as JSON, for the Python side.

  adapters.py LLAMA_LAYER_RANGE_CPP LLAMA_ARCH_CPP OUT.json

The one list of architectures a shard can serve is the table LLAMA_LAYER_RANGE_ADAPTERS in
src/llama-layer-range.cpp (patch 0006; each adapter patch adds its row). The C++ engine reads it
through llama_layer_range_architectures(); this script reads the same rows from the applied
source and maps each LLM_ARCH_* constant to its GGUF name through LLM_ARCH_NAMES in
src/llama-arch.cpp, so the tracker (python/meshnet/recipe/adapters.py) sees the same list
without a C++ build of its own. Writes {"architectures": {name: {"experts": bool}}}, in table
order. Fails, naming the file, when either table cannot be found or a row has no name.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_TABLE = re.compile(r"LLAMA_LAYER_RANGE_ADAPTERS\[\]\s*=\s*\{(?P<rows>.*?)\n\};", re.DOTALL)
_ROW = re.compile(r"\{\s*(?P<arch>LLM_ARCH_\w+)\s*,\s*(?P<experts>true|false)\s*\}")
_NAME = re.compile(r"\{\s*(?P<arch>LLM_ARCH_\w+)\s*,\s*\"(?P<name>[^\"]+)\"\s*\}")


def adapters(range_source: str, arch_source: str) -> dict[str, dict]:
    table = _TABLE.search(range_source)
    if table is None:
        raise ValueError("no LLAMA_LAYER_RANGE_ADAPTERS table in src/llama-layer-range.cpp")
    rows = [(m["arch"], m["experts"] == "true") for m in _ROW.finditer(table["rows"])]
    if not rows:
        raise ValueError("LLAMA_LAYER_RANGE_ADAPTERS has no rows")
    names = {m["arch"]: m["name"] for m in _NAME.finditer(arch_source)}
    out: dict[str, dict] = {}
    for arch, experts in rows:
        if arch not in names:
            raise ValueError(f"{arch} has no name in LLM_ARCH_NAMES (src/llama-arch.cpp)")
        out[names[arch]] = {"experts": experts}
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    found = adapters(Path(argv[1]).read_text(), Path(argv[2]).read_text())
    Path(argv[3]).write_text(json.dumps({"architectures": found}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
