"""Repository rule @llama_cpp: the pinned llama.cpp commit with the project's patch series.

Source: the pip sdist pinned in third_party/versions.bzl (hash-checked by pip), whose
vendor/llama.cpp is a git checkout. tools/llama_cpp/prepare_source.sh verifies HEAD is the pinned
commit and the tree is clean, then applies the series with `git am`; any mismatch fails the
fetch with a message. `--repo_env=MESHNET_LLAMA_PATCH_LEVEL=N` applies only the first N patches
(bisecting); the default is all of them. @llama_cpp_upstream is the same pin with no patches and
ignores that variable: the benchmarks' unpatched baseline. third_party/llama_cpp/llama_cpp.BUILD is the overlay.
"""

load("//third_party:pip_download.bzl", "pip_download")

def _llama_cpp_impl(rctx):
    patches = [rctx.path(p) for p in rctx.attr.patches]
    level_env = rctx.os.environ.get("MESHNET_LLAMA_PATCH_LEVEL", "") if rctx.attr.patch_level_env else ""
    level = str(len(patches)) if level_env in ("", "all") else level_env
    sdist = pip_download(rctx, rctx.attr.sdist, rctx.attr.sdist_sha256, sdist = True)
    script = rctx.path(rctx.attr._prepare)
    rctx.report_progress("verifying llama.cpp %s and applying %s patches" % (rctx.attr.commit[:12], level))
    res = rctx.execute(
        ["bash", str(script), str(sdist), rctx.attr.sdist_subdir, rctx.attr.commit, str(rctx.path("_staging")), level] +
        [str(p) for p in patches],
        timeout = 1800,
        quiet = True,
    )
    if res.return_code != 0:
        fail("@llama_cpp: %s" % res.stderr)
    rctx.delete("_download")

    # Move the tree to the repository root so the overlay's labels read like upstream paths.
    for entry in rctx.path("_staging").readdir():
        rctx.execute(["mv", str(entry), str(rctx.path(entry.basename))])
    rctx.delete("_staging")
    head = rctx.execute(["git", "rev-parse", "HEAD"]).stdout.strip()
    rctx.file("PIN_INFO", "commit %s\npatch_level %s of %d\nhead %s\n" % (
        rctx.attr.commit,
        level,
        len(patches),
        head,
    ))
    rctx.file("PIN_COMMIT", rctx.attr.commit + "\n")
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("build_config.bzl", "# Written by third_party/llama_cpp/repository.bzl.\nLLAMAFILE = %s\n" % rctx.attr.llamafile)
    rctx.symlink(rctx.attr.build_file, "BUILD.bazel")

llama_cpp_repository = repository_rule(
    implementation = _llama_cpp_impl,
    attrs = {
        "commit": attr.string(mandatory = True),
        "sdist": attr.string(mandatory = True),
        "sdist_sha256": attr.string(mandatory = True),
        "sdist_subdir": attr.string(mandatory = True),
        "patches": attr.label_list(allow_files = [".patch"]),
        "build_file": attr.label(mandatory = True, allow_single_file = True),
        "patch_level_env": attr.bool(default = True),
        # ggml's llamafile GEMM (tinyBLAS) for F32/F16/BF16/Q8_0/Q4_0/Q5_0/IQ4_NL weights. It runs
        # only for 2+ rows (one row takes ggml's vec_dot) and sums in another order, so a row's
        # numbers would depend on how many rows share its batch; the shard build turns it off so
        # sessions batched together compute exactly what each computes alone.
        "llamafile": attr.bool(default = False),
        "_prepare": attr.label(default = "//tools/llama_cpp:prepare_source.sh", allow_single_file = True),
    },
    environ = ["MESHNET_LLAMA_PATCH_LEVEL", "MESHNET_PYTHON"],
)
