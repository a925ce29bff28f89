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


def _packlab_imports() -> dict[str, set[str]]:
    """``{module: packlab modules it imports}`` for every module of the package, read from its source."""
    import ast

    package = ROOT / "packlab"
    modules = {}
    for path in package.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for imported in names:
                target = owner(imported) if imported.startswith("packlab") else None
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def test_packlab_has_no_import_cycle():
    """No module imports, directly or through others, a module that imports it back."""
    graph = _packlab_imports()
    # a package's __init__ importing its own submodules is not a cycle, nor a submodule importing its package
    edges = {a: {b for b in targets if not a.startswith(b + ".") and not b.startswith(a + ".")} for a, targets in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_teaching_library_never_imports_the_course_machinery():
    """packlab's top level is the library the chapters teach; packlab.course builds, runs and grades the course."""
    graph = _packlab_imports()
    leaks = {m: sorted(t for t in targets if t.startswith("packlab.course")) for m, targets in graph.items()
             if not m.startswith("packlab.course")}
    assert not {m: t for m, t in leaks.items() if t}, leaks
    top = {p.stem if p.is_file() else p.name for p in (ROOT / "packlab").iterdir()
           if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    machinery = {"grading", "grade", "exercises", "book", "lab", "prose", "schedule", "pytest_book_cache", "testrun"}
    assert not top & machinery, f"course machinery at packlab's top level: {sorted(top & machinery)}"
