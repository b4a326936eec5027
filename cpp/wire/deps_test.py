"""The seam vocabulary, and the code that needs only the vocabulary, link no protobuf (issue 34).

`:protobuf_free_deps` (a genquery beside this test) lists every dependency of //cpp/wire, the
engine, its sampler, the worker's scheduler and its session table. This test fails when any of
them is a protobuf, gRPC or zlib target, a generated proto library, or the codec //cpp/protocol
that brings them in: those packages must depend on //cpp/wire instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

FORBIDDEN = re.compile(r"protobuf|_cc_proto|_cc_grpc|grpc|zlib|^//proto/|^//cpp/protocol[:/]")


def _forbidden(labels: list[str]) -> list[str]:
    return [label for label in labels if FORBIDDEN.search(label)]


def _labels() -> list[str]:
    return Path(os.environ["MESHNET_PROTOBUF_FREE_DEPS"]).read_text(encoding="utf-8").split()


def test_the_vocabulary_and_its_users_link_no_protobuf():
    labels = _labels()
    # The query saw the whole closure: the vocabulary itself and llama.cpp under the engine.
    assert "//cpp/wire:wire" in labels
    assert "//cpp/engine/sampler:sampler" in labels
    assert "//cpp/worker/sessions:sessions" in labels
    assert any(label.startswith("@llama_cpp//") for label in labels)
    assert _forbidden(labels) == []


def test_the_check_finds_a_protobuf_dependency():
    labels = [
        "//cpp/wire:wire",
        "//cpp/protocol:protocol",
        "//proto/meshnet/shard/v1:shard_cc_proto",
        "@system_libs//:protobuf",
        "@system_libs//:grpc",
        "@llama_cpp//:llama",
    ]
    assert _forbidden(labels) == labels[1:5]
