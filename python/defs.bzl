"""meshnet_binary: a py_binary at a stable //python label whose entry point lives in a role package.

The role package exports the entry point (exports_files) and its py_library carries the module
and imports; the binary lists only that file, as Bazel wants `main` among `srcs`.

`flags` maps a command-line flag to a label: the binary gets `FLAG=$(location LABEL)` as a
default argument (in the dict's order) and the label as data, so the two never disagree.
"""

def meshnet_binary(name, main, deps, flags = {}):
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
        deps = deps,
    )

def role_library(name, deps = [], visibility = ["//visibility:public"], test_support = [], **kwargs):
    """The py_library of a python/meshnet/<role>/ package: every module but the tests and the
    `test_support` modules (shared test fixtures, which get a testonly library of their own),
    importable as meshnet.<role>.* (python/ is the import root)."""
    native.py_library(
        name = name,
        srcs = native.glob(["*.py"], exclude = ["*_test.py"] + test_support),
        imports = ["../.."],
        visibility = visibility,
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
