"""Which engine tools a certification's placement runs with (ADR 0015): the CPU's, or those linked
with its one GPU backend, Vulkan (set by bazel run) or CUDA (built by hand: `//...` does not build
ggml-cuda); a placement whose tools were not given, or with two GPU backends, is refused by name."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from meshnet.certify.devices import TOOL_FLAGS, Tools, parse_devices, tools_for


def given(*backends: str) -> argparse.Namespace:
    names = [name for b in TOOL_FLAGS for name in TOOL_FLAGS[b]]
    return argparse.Namespace(**{name: Path(f"/bin/{name}") if any(name in TOOL_FLAGS[b] for b in backends) else None
                                 for name in names})


def test_each_backend_runs_with_its_own_build_of_the_tools():
    assert tools_for(given("cpu"), parse_devices("cpu", 3)) == Tools(*(Path(f"/bin/{n}") for n in TOOL_FLAGS["cpu"]))
    assert tools_for(given("cuda"), parse_devices("cpu,cuda0,cpu", 3)).worker == Path("/bin/worker_binary_cuda")
    assert tools_for(given("vulkan"), parse_devices("vulkan0", 2)).greedy == Path("/bin/greedy_binary_vulkan")


@pytest.mark.parametrize("devices,tools,message", [
    ("cuda0", ("cpu", "vulkan"), "needs --worker-binary-cuda, --greedy-binary-cuda, --dump-boundaries-cuda "
                                 "(built by hand"),
    ("vulkan0", ("cpu",), "(set by bazel run)"),
    ("cpu,vulkan0,cuda0", ("cpu", "vulkan", "cuda"), "at most one GPU backend"),
])
def test_a_placement_without_its_tools_is_refused_by_name(devices, tools, message):
    with pytest.raises(ValueError) as refused:
        tools_for(given(*tools), parse_devices(devices, 3))
    assert message in str(refused.value)
