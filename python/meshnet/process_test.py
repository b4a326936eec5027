"""Process plumbing: CPU time of a process."""

import os
import subprocess
import sys
import time

from meshnet.process import cpu_seconds, raise_file_limit


def test_cpu_seconds_counts_a_process_s_work_and_is_none_once_it_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                              "while time.process_time() < end: pass\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while (cpu_seconds(child.pid) or 0.0) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        used = cpu_seconds(child.pid)
        assert used is not None and 0.25 <= used < 5.0
    finally:
        child.communicate(b"")
    assert cpu_seconds(child.pid) is None  # reaped: no /proc entry


def test_cpu_seconds_of_this_process_matches_process_time():
    own = cpu_seconds(os.getpid())
    assert own is not None and abs(own - time.process_time()) < 0.5


def test_the_file_limit_is_raised_to_the_hard_limit():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        assert raise_file_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
