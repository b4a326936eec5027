"""meshnet_binary: a py_binary at a stable //python label whose entry point lives in a role package.

The role package exports the entry point (exports_files) and its py_library carries the module
and imports; the binary lists only that file, as Bazel wants `main` among `srcs`.

`flags` maps a command-line flag to a label: the binary gets `FLAG=$(location LABEL)` as a
default argument (in the dict's order) and the label as data, so the two never disagree.
"""

load("//python:rooms.bzl", "ROOMS", "room_of", "room_visibility")

def meshnet_binary(name, main, deps = None, flags = {}, testonly = False):
    # deps: by default the library named after main's package (//python/meshnet/gateway:main.py
    # -> //python/meshnet/gateway).
    if deps == None:
        deps = [main.split(":")[0]]
    data = []
    for label in flags.values():
        if label not in data:
            data.append(label)
    native.py_binary(
        name = name,
        srcs = [main],
        main = main,
        args = ["%s=$(location %s)" % (flag, label) for flag, label in flags.items()],
        data = data,
        python_version = "PY3",
        testonly = testonly,
        deps = deps,
    )

def role_library(name, srcs = None, deps = [], data = [], visibility = None, test_support = [], **kwargs):
    """A py_library of a python/meshnet/<room>/ package, fenced by python/rooms.bzl.

    srcs: by default every module but the tests and the `test_support` modules (shared test
    fixtures, which get a testonly library of their own). Importable as meshnet.<room>.*.
    visibility: by default the room's, from the table (its own tree and the rooms that list it);
    a narrower list may be given. The sources' imports are checked against the room's `imports`
    by a build action (tools/rooms/check_imports.py) that the library carries as data, so any
    target that uses the library, and `bazel build //...`, fails on a forbidden import.
    """
    package = native.package_name()
    room = room_of(package)
    if room not in ROOMS:
        fail("%s is not a room of python/rooms.bzl" % package)
    if srcs == None:
        srcs = native.glob(["*.py"], exclude = ["*_test.py"] + test_support)
    checked = name + "_imports"
    native.genrule(
        name = checked,
        srcs = srcs,
        outs = [name + "_imports.checked"],
        cmd = "$(location //tools/rooms:check_imports) --room %s --may-import '%s' --out $@ $(SRCS)" % (
            room,
            ",".join(ROOMS[room].imports),
        ),
        tools = ["//tools/rooms:check_imports"],
        testonly = kwargs.get("testonly", False),
    )
    native.py_library(
        name = name,
        srcs = srcs,
        data = data + [":" + checked],
        imports = ["/".join([".."] * (len(package.split("/")) - 1))],
        visibility = visibility if visibility != None else room_visibility(room),
        deps = deps,
        **kwargs
    )

# The native tools the certification suite runs (//python:certify and the certification tests),
# by the flags python/meshnet/certify/main.py takes them with.
CERTIFY_TOOLS = {
    "--worker-binary": "//cpp/worker:worker",
    "--greedy-binary": "//cpp/engine:greedy",
    "--dump-logits": "//cpp/engine:dump_logits",
    "--dump-boundaries": "//cpp/engine:dump_boundaries",
    "--measure-shard": "//cpp/engine:measure_shard",
    "--tokenize-binary": "//cpp/engine:tokenize",
}

# The same tools linked with ggml's Vulkan backend, for `certify --device vulkanN` and routes that
# mix the CPU and Vulkan (ADR 0015).
CERTIFY_VULKAN_TOOLS = {
    "--worker-binary-vulkan": "//cpp/worker:worker_vulkan",
    "--greedy-binary-vulkan": "//cpp/engine:greedy_vulkan",
    "--dump-boundaries-vulkan": "//cpp/engine:dump_boundaries_vulkan",
}

# Both: what //python:certify takes.
CERTIFY_ALL_TOOLS = dict(CERTIFY_TOOLS, **CERTIFY_VULKAN_TOOLS)

# The native tools and models the other commands of python/BUILD.bazel take, by command and flag.
COMMAND_TOOLS = {
    "swarm": {
        "--gguf": "@smollm2//:gguf",
        "--gemma3-gguf": "@gemma3//:gguf",
        "--tokenize-binary": "//cpp/engine:tokenize",
        "--vulkan-worker-binary": "//cpp/worker:worker_vulkan",
        "--worker-binary": "//cpp/worker:worker",
    },
    "bench": {
        "--gguf": "@smollm2//:gguf",
        "--worker-binary": "//cpp/worker:worker",
        "--vulkan-worker-binary": "//cpp/worker:worker_vulkan",
        "--batched-bench": "@llama_cpp_upstream//:llama-batched-bench",
        "--rpc-server": "@llama_cpp_upstream//:ggml-rpc-server",
        "--quantize": "@llama_cpp_upstream//:llama-quantize",
        "--dump-logits": "//cpp/engine:dump_logits",
        "--dump-boundaries": "//cpp/engine:dump_boundaries",
        "--calibration": "//docs:evidence/verification/calibration.json",
    },
    "soak": {
        "--gguf": "@smollm2//:gguf",
        "--worker-binary": "//cpp/worker:worker",
    },
    "bench_drift": {
        "--gguf": "@smollm2//:gguf",
        "--dump-logits": "//cpp/engine:dump_logits",
    },
    "verify_calibrate": {
        "--gguf": "@smollm2//:gguf",
        "--dump-boundaries": "//cpp/engine:dump_boundaries",
        "--greedy": "//cpp/engine:greedy",
        "--vulkan-dump-boundaries": "//cpp/engine:dump_boundaries_vulkan",
        "--vulkan-greedy": "//cpp/engine:greedy_vulkan",
        "--quantize": "@llama_cpp_upstream//:llama-quantize",
    },
    "verifier": {
        "--gguf": "@smollm2//:gguf",
        "--dump-boundaries": "//cpp/engine:dump_boundaries",
        "--vulkan-dump-boundaries": "//cpp/engine:dump_boundaries_vulkan",
        "--calibration": "//docs:evidence/verification/calibration.json",
    },
}
