"""swarm_test: a py_pytest over real swarm processes, with the bundled model, the native worker
and single-process llama.cpp's greedy binary, the environment variables that name them, and
the libraries every such test uses (client, swarm launcher, reference model, shared cases)."""

load("//tools:pytest.bzl", "py_pytest")

def swarm_test(name, srcs, deps = [], data = [], env = {}, **kwargs):
    py_pytest(
        name = name,
        srcs = srcs,
        data = [
            "//cpp/engine:greedy",
            "//cpp/worker:worker",
            "@smollm2//:gguf",
        ] + data,
        env = dict({
            "MESHNET_BUNDLED_GGUF": "$(location @smollm2//:gguf)",
            "MESHNET_GREEDY_BINARY": "$(location //cpp/engine:greedy)",
            "MESHNET_WORKER_BINARY": "$(location //cpp/worker:worker)",
        }, **env),
        deps = [
            "//python/meshnet/client",
            "//python/meshnet/reference",
            "//python/meshnet/swarm",
            "//tests:route_cases",
        ] + deps,
        **kwargs
    )
