"""py_pytest: a py_test that runs its sources under pytest (locked venv), one Bazel test each."""

def py_pytest(name, srcs, deps = [], data = [], args = [], **kwargs):
    native.py_test(
        name = name,
        srcs = srcs + ["//tools:pytest_runner.py"],
        main = "//tools:pytest_runner.py",
        # importlib mode: pytest must not put test folders on sys.path (a module there, e.g. a
        # package's "types", would shadow the standard library's in child processes).
        args = ["-p", "no:cacheprovider", "-q", "--import-mode=importlib"] + ["$(location %s)" % s for s in srcs] + args,
        data = data,
        deps = deps,
        python_version = "PY3",
        **kwargs
    )
