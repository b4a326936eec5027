"""Which GGUF architectures a shard can serve: the layer-range adapters of the patched llama.cpp.

The list is written once, as the adapter table of the patch series
(third_party/llama_cpp/patches/0006 and the adapter patches after it). The C++ engine asks
llama.cpp for it; the build extracts the same table into adapters.json beside this module
(//python/meshnet/recipe:adapters), which this module reads ($MESHNET_ADAPTERS_JSON names
another copy, for running the sources outside Bazel). A model of any other architecture
is registered dark by the tracker and refused by the worker.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path


class AdaptersUnavailable(RuntimeError):
    """adapters.json is missing: the module runs outside the Bazel build that makes it."""


@functools.lru_cache(maxsize=1)
def layer_range_adapters() -> dict[str, bool]:
    """GGUF architecture name -> whether its mixture-of-experts models are allowed, in table order."""
    path = Path(__file__).with_name("adapters.json")
    if not path.exists() and os.environ.get("MESHNET_ADAPTERS_JSON"):
        path = Path(os.environ["MESHNET_ADAPTERS_JSON"])
    if not path.exists():
        raise AdaptersUnavailable(f"{path} is missing: it is made by //python/meshnet/recipe:adapters from the "
                                  "patched llama.cpp's adapter table; run through tools/bazel")
    table = json.loads(path.read_text())["architectures"]
    return {name: bool(row["experts"]) for name, row in table.items()}


def has_adapter(architecture: str, n_expert: int = 0) -> bool:
    """Whether a model of `architecture` with `n_expert` experts per layer can be served in shards."""
    adapters = layer_range_adapters()
    return architecture in adapters and (n_expert == 0 or adapters[architecture])
