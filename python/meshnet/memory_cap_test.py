"""A process over its cap is OOM-killed and its record says so; a process under the same cap
beside it runs to its end, with its peak recorded."""

from __future__ import annotations

import sys

import pytest

from meshnet.memory_cap import CappedRunner, cgroup_problem

pytestmark = pytest.mark.skipif(cgroup_problem() is not None, reason=str(cgroup_problem()))
MIB = 1 << 20


def holding(mib: int) -> list[str]:
    """A Python process that touches `mib` MiB of anonymous memory, then exits 0."""
    return [sys.executable, "-c", f"b = bytearray({mib * MIB}); b[::4096] = b'x' * len(b[::4096]); print('held')"]


def test_a_process_over_its_cap_is_killed_and_one_under_it_is_not():
    runner = CappedRunner(200 * MIB, "memory-cap-test")
    over = runner.run("400 MiB under 200", holding(400))
    under = runner.run("50 MiB under 200", holding(50))
    assert over.returncode != 0 and runner.records[0].oom_killed
    assert under.returncode == 0 and under.stdout.strip() == "held" and not runner.records[1].oom_killed
    assert 50 * MIB < runner.records[1].cgroup_peak_bytes <= 200 * MIB
    assert runner.records[1].peak_rss_bytes < 200 * MIB  # sampled: a 0.1 s process may be seen before its peak


def test_uncapped_runs_are_measured_not_limited():
    runner = CappedRunner(None)
    assert runner.run("uncapped", holding(300)).returncode == 0
    [record] = runner.records
    assert not record.oom_killed and record.cgroup_peak_bytes > 300 * MIB
    with pytest.raises(ValueError):
        CappedRunner(0)
