"""worker_binary: the shard worker (main.cc), alone or with a GPU backend of ggml linked in."""

load("@rules_cc//cc:defs.bzl", "cc_binary")

# What every worker binary links: flags, the service and the engine it drives.
WORKER_DEPS = [
    "//cpp/worker:flags",
    "//cpp/worker:service",
    "//cpp/engine",
    "//cpp/protocol:ticket",
    "//cpp/worker/scheduler",
    "@system_libs//:grpc",
]

def worker_binary(name, backend = None, **kwargs):
    """A public cc_binary of cpp/worker/main.cc; `backend` is the alwayslink library of a ggml
    backend (//cpp/engine/vulkan, //cpp/engine/cuda) that `--device=...` then selects."""
    cc_binary(
        name = name,
        srcs = ["//cpp/worker:main.cc"],
        visibility = ["//visibility:public"],
        deps = WORKER_DEPS + ([backend] if backend else []),
        **kwargs
    )
