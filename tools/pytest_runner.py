"""Entry point of every py_pytest target: runs pytest on the files Bazel passes as arguments.

Exit status is pytest's, except that "no tests collected" (5) is a failure here too: a test
target that runs nothing is a defect.
"""

import sys

import pytest

if __name__ == "__main__":
    code = pytest.main(sys.argv[1:])
    sys.exit(1 if code == pytest.ExitCode.NO_TESTS_COLLECTED else int(code))
