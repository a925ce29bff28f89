"""``make test``'s phases: an empty phase fails, except the serial one."""

import subprocess

import pytest

from packlab.course import testrun


@pytest.mark.parametrize("empty, expected", [("serial", 0), ("unit", 1), ("notebooks", 1), ("browser", 1)])
def test_a_phase_that_collects_nothing_fails_unless_it_may_be_empty(monkeypatch, tmp_path, capsys, empty, expected):
    monkeypatch.setattr(testrun.paths, "build_dir", lambda: tmp_path)
    monkeypatch.setattr(testrun, "convert_notebooks", lambda root: [])

    def fake_run(command, cwd):
        phase = next(p for p, c in testrun.phase_commands(4, 600, []).items() if c == command)
        return subprocess.CompletedProcess(command, testrun.NO_TESTS_COLLECTED if phase == empty else 0)

    monkeypatch.setattr(testrun.subprocess, "run", fake_run)
    assert testrun.run(list(testrun.PHASES), jobs=4, cell_timeout=600, extra=[]) == expected
    assert (tmp_path / "test-times.json").exists()
