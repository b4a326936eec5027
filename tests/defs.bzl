"""swarm_test: a py_pytest over real GGUF processes, with the bundled model, the native worker
and single-process llama.cpp's greedy binary, and the environment variables that name them."""

load("//tools:pytest.bzl", "py_pytest")

def swarm_test(name, srcs, deps = [], **kwargs):
    py_pytest(
        name = name,
        srcs = srcs,
        data = [
            "//cpp/engine:greedy",
            "//cpp/worker:worker",
            "@smollm2//:gguf",
        ],
        env = {
            "MESHNET_BUNDLED_GGUF": "$(location @smollm2//:gguf)",
            "MESHNET_GREEDY_BINARY": "$(location //cpp/engine:greedy)",
            "MESHNET_WORKER_BINARY": "$(location //cpp/worker:worker)",
        },
        deps = deps,
        **kwargs
    )
