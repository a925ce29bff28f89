"""``make system-deps``: installs the tests' Debian packages once, serially, and only what is missing.

Each test fakes the machine: PATH holds only a folder of fake programs, and a fake package
manager (a Python script named like Debian's) records every call and, on ``install``,
creates the named packages' programs. Nothing real is installed.
"""

from __future__ import annotations

import ast
import io
import json
import sys
from pathlib import Path

import pytest

from packlab import paths
from packlab.course import system_deps

APT = "apt" + "-get"  # spelled in two pieces: tests/ must never name the real command (see the last test)

FAKE_APT = """#!{python}
import json, os, sys
from pathlib import Path
bin_dir = Path({bin_dir!r})
with open({calls!r}, "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
fail = os.environ.get("FAKE_APT_FAIL", "")
if fail and sys.argv[1] == fail:
    print("E: Unable to locate package", file=sys.stderr)
    sys.exit(100)
programs = json.loads({programs!r})
if sys.argv[1] == "install":
    for name in sys.argv[2:]:
        for program in programs.get(name, []):
            path = bin_dir / program
            path.write_text("#!/bin/sh\\nexit 0\\n")
            path.chmod(0o755)
"""


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A machine with none of the packages, root, and a fake package manager on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    programs = json.dumps({p.name: list(p.programs) for p in system_deps.PACKAGES})
    apt = bin_dir / APT
    apt.write_text(FAKE_APT.format(python=sys.executable, bin_dir=str(bin_dir), calls=str(calls), programs=programs))
    apt.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("FAKE_APT_FAIL", raising=False)
    monkeypatch.setattr(system_deps.os, "geteuid", lambda: 0)

    class Machine:
        def calls(self) -> list[list[str]]:
            return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

        def run(self) -> tuple[int, str]:
            log = io.StringIO()
            status = system_deps.ensure(log=log)
            return status, log.getvalue()

    Machine.bin_dir = bin_dir
    return Machine()


def test_it_installs_what_is_missing_with_one_install_then_does_nothing(machine):
    status, log = machine.run()
    names = [p.name for p in system_deps.PACKAGES]
    assert status == 0, log
    assert [c[0] for c in machine.calls()] == ["update", "install"], machine.calls()
    assert sorted(machine.calls()[1][machine.calls()[1].index("--no-install-recommends") + 1:]) == sorted(names)
    assert f"installed {', '.join(names)}" in log
    assert not system_deps.missing()

    status, log = machine.run()  # idempotent: the second run finds everything
    assert status == 0 and "all present" in log, log
    assert len(machine.calls()) == 2, "the second run called the package manager again"


def test_it_installs_only_the_packages_whose_programs_are_missing(machine):
    for program in system_deps.find("chromium").programs:
        (machine.bin_dir / program).write_text("#!/bin/sh\n")
        (machine.bin_dir / program).chmod(0o755)
    status, log = machine.run()
    assert status == 0, log
    installed = machine.calls()[1]
    assert "chromium" not in installed and "slurm-wlm" in installed and "munge" in installed


def test_a_failed_install_is_reported_and_fails_only_under_ci(machine, monkeypatch):
    monkeypatch.setenv("FAKE_APT_FAIL", "install")
    status, log = machine.run()
    assert status == 0
    assert "failed (exit 100)" in log and "Unable to locate package" in log
    assert "the browser tests" in log and "will be skipped" in log
    monkeypatch.setenv("CI", "true")
    status, log = machine.run()
    assert status == 1 and "Under CI=true every test must run" in log


def test_without_root_or_without_the_package_manager_it_says_what_to_do(machine, monkeypatch):
    monkeypatch.setattr(system_deps.os, "geteuid", lambda: 1000)
    status, log = machine.run()
    assert status == 0 and "sudo make system-deps" in log and machine.calls() == []
    (machine.bin_dir / APT).unlink()
    monkeypatch.setattr(system_deps.os, "geteuid", lambda: 0)
    monkeypatch.setenv("CI", "true")
    status, log = machine.run()
    assert status == 1 and "there is no" in log


def test_a_test_that_needs_a_missing_package_skips_and_says_how_to_get_it(machine, monkeypatch):
    with pytest.raises(pytest.skip.Exception, match="make system-deps"):
        system_deps.require("munge", skip=pytest.skip, fail=pytest.fail)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="under CI=true"):
        system_deps.require("slurm-wlm", skip=pytest.skip, fail=pytest.fail)


def test_make_test_installs_the_packages_before_any_test_and_no_test_installs_them():
    makefile = (paths.repo_root() / "Makefile").read_text()
    test_rule = next(line for line in makefile.splitlines() if line.startswith("test:"))
    assert "system-deps" in test_rule.split(":", 1)[1].split()
    offenders = []
    for path in sorted((paths.repo_root() / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and APT in node.value:
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"tests that name the package manager (install in system_deps.PACKAGES instead): {offenders}"


def test_the_hub_selection_is_bubblewrap_alone_with_the_dnf_line_beside_the_apt_one(machine, capsys):
    assert [p.name for p in system_deps.hub_packages()] == ["bubblewrap"]
    assert system_deps.main(["--hub"]) == 0
    said = capsys.readouterr().out
    assert f"sudo {APT} install --no-install-recommends bubblewrap" in said
    assert "RHEL, Rocky, Alma:  sudo dnf install bubblewrap" in said
    installed = machine.calls()[1]
    assert installed[-1] == "bubblewrap" and "chromium" not in installed and "slurm-wlm" not in installed
    assert system_deps.main(["--hub", "--list"]) == 0 and capsys.readouterr().out == "bubblewrap\n"


def test_make_system_deps_hub_passes_the_hub_selection():
    makefile = (paths.repo_root() / "Makefile").read_text()
    rule = makefile.split("\nsystem-deps:", 1)[1].split("\n\n", 1)[0]
    assert "packlab.course.system_deps $(if $(HUB),--hub)" in rule
