"""Repository hygiene: generated things stay out of git, CI runs the README's test command."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from packlab import paths

ROOT = paths.repo_root()


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def test_nothing_generated_is_tracked():
    tracked = _tracked_files()
    offenders = [
        f
        for f in tracked
        if f.startswith(("data/", "_build/", ".venv/", ".tools/"))
        or f.endswith(".ipynb")
        or f in ("uv.lock", "poetry.lock", "pylock.toml", "Pipfile.lock")
    ]
    assert not offenders, f"generated files or lock files are committed: {offenders}"


def test_nothing_tracked_records_registry_hosts():
    pattern = re.compile(r"(files\.pythonhosted\.org|pypi\.org/simple|download\.pytorch\.org|/opt/wheels)")
    hits = []
    for name in _tracked_files():
        path = ROOT / name
        if path.is_file() and path.suffix in {".toml", ".yml", ".yaml", ".txt", ".cfg", ""}:
            if pattern.search(path.read_text(errors="ignore")):
                hits.append(name)
    assert not hits, f"files that record download locations: {hits}"


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == "make test"
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make book" in readme
    assert readme.index("make book") < 600, "the README opens with the two commands"
