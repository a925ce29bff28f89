"""What a process may use, and what torch starts: affinity is followed, a CPU-time quota is not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from packlab import cpus


def test_the_report_counts_this_process():
    report = cpus.cpu_report()
    assert report["visible cores (os.cpu_count)"] == os.cpu_count()
    assert 1 <= report["cores it may run on (affinity)"] <= os.cpu_count()
    quota = report["CPU-time quota (cgroup)"]
    assert quota is None or quota > 0


def test_quota_files_are_read_in_both_cgroup_versions(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpus._quota_of(tmp_path, "v2") == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpus._quota_of(tmp_path, "v2") is None
    (tmp_path / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus._quota_of(tmp_path, "v1") == 0.5
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus._quota_of(tmp_path, "v1") is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_torch_follows_the_affinity():
    assert cpus.torch_default_threads(cores={sorted(os.sched_getaffinity(0))[0]}) == 1


@pytest.mark.skipif(not cpus.quota_cgroups_available(), reason="making a cgroup with a CPU quota needs root")
def test_torch_ignores_a_cpu_time_quota_which_the_report_sees():
    allowed = len(os.sched_getaffinity(0))
    assert cpus.torch_default_threads(cpus=0.5) == allowed
    group, procs = cpus._make_quota_cgroup(0.5)
    try:
        seen = subprocess.run([sys.executable, "-c", "from packlab import cpus; print(cpus.cpu_quota())"],
                              preexec_fn=lambda: procs.write_text("0"), capture_output=True, text=True, check=True)
    finally:
        group.rmdir()
    assert float(seen.stdout.split()[-1]) == 0.5
    assert not group.exists()
