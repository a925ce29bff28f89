"""The packages ``make setup`` installs without their dependencies: ``[tool.packlab] no-deps`` of pyproject.toml.

``python -m packlab.course.nodeps`` prints them, one ``name==version`` per argument, for
``uv pip install --no-deps``. Why a package is there is written beside the list.
"""

from __future__ import annotations

from packlab import paths


def no_deps_pins() -> list[str]:
    """``name==version`` of every package to install with ``--no-deps``."""
    try:
        import tomllib
    except ImportError:  # Python 3.10, which the course supports, has no tomllib: read the array by pattern
        from packlab.course.installed import _array

        return [f"{name}=={pinned}" for name, pinned in _array((paths.repo_root() / "pyproject.toml").read_text(), "no-deps")]
    project = tomllib.loads((paths.repo_root() / "pyproject.toml").read_text())
    return list(project.get("tool", {}).get("packlab", {}).get("no-deps", []))


if __name__ == "__main__":
    print(" ".join(no_deps_pins()))
