"""Entry point of every py_pytest target: runs pytest on the files Bazel passes as arguments.

Exit status is pytest's, except that "no tests collected" (5) is a failure here too: a test
target that runs nothing is a defect.

Mesa's shader cache goes to the test's own folder (when Bazel gives one): the sandbox leaves no
writable home for it, and without a cache every Vulkan process on lavapipe compiles ggml's
shaders again (about 25 s each here, against 1 s with the cache); the processes of one test share
it, and nothing leaves the test.
"""

import os
import sys

import pytest

if __name__ == "__main__":
    if os.environ.get("TEST_TMPDIR") and not os.environ.get("MESA_SHADER_CACHE_DIR"):
        os.environ["MESA_SHADER_CACHE_DIR"] = os.path.join(os.environ["TEST_TMPDIR"], "mesa-shader-cache")
    code = pytest.main(sys.argv[1:])
    sys.exit(1 if code == pytest.ExitCode.NO_TESTS_COLLECTED else int(code))
