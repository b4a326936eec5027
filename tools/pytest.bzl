"""py_pytest: a py_test that runs its sources under pytest (locked venv), one Bazel test each."""

def py_pytest(name, srcs, deps = [], data = [], args = [], **kwargs):
    native.py_test(
        name = name,
        srcs = srcs + ["//tools:pytest_runner.py"],
        main = "//tools:pytest_runner.py",
        # importlib mode: pytest must not put python/meshnet on sys.path (meshnet.types would
        # shadow the standard library's types module in child processes).
        args = ["-p", "no:cacheprovider", "-q", "--import-mode=importlib"] + ["$(location %s)" % s for s in srcs] + args,
        data = data,
        deps = deps,
        python_version = "PY3",
        **kwargs
    )
