"""Is the environment already what ``pyproject.toml`` pins? ``make setup`` asks before it installs anything.

``make setup`` used to reinstall whenever ``pyproject.toml`` was newer than the
environment, so a release that touched the file in any way sent every attendee's next
``make lab`` to PyPI, at the venue. Now the Makefile runs this first::

    python -m packlab.course.installed          # the attendee's packages (dependencies and no-deps)
    python -m packlab.course.installed --dev    # those and the dev and dali extras (make setup-dev)

It exits 0 when every pinned distribution is installed at its pinned version (a local
label such as ``+cpu`` or ``+cu130`` does not count: it is the same release) and
``packlab`` itself is installed; then nothing needs installing. Otherwise it lists what
differs and exits 1, and ``make setup`` installs. In a conda environment (``make
configure VENV=$CONDA_PREFIX``) it exits 2 instead, with the conda commands: the
Makefile never installs into a conda environment with ``uv``.

Standard library only, and Python 3.10 (no ``tomllib`` there): it runs in whatever
environment ``VENV`` names.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packlab import paths

#: Exit statuses: all pinned versions installed / something to install / a conda environment to fix by hand.
SATISFIED, MISSING, CONDA = 0, 1, 2
_PIN = re.compile(r'"([A-Za-z0-9_.\-]+)==([^"\s;]+)"')


def _array(text: str, key: str) -> list[tuple[str, str]]:
    """The ``name==version`` pins of the TOML array ``key = [...]`` (first one in the file)."""
    match = re.search(rf"^{re.escape(key)}\s*=\s*\[(.*?)^\]", text, flags=re.S | re.M)
    if match is None:  # a one-line array
        match = re.search(rf"^{re.escape(key)}\s*=\s*\[(.*?)\]", text, flags=re.M)
    return _PIN.findall(match.group(1)) if match else []


def pinned(root: Path | None = None, dev: bool = False) -> dict[str, str]:
    """``{distribution: version}`` that ``make setup`` (``dev=True``: ``make setup-dev``, the dev and dali extras) installs."""
    text = ((root or paths.repo_root()) / "pyproject.toml").read_text()
    pins = _array(text, "dependencies") + _array(text, "no-deps") + (_array(text, "dev") + _array(text, "dali") if dev else [])
    return {name.lower(): pinned_version for name, pinned_version in pins}


def wheelhouse_requirements(root: Path | None = None) -> list[str]:
    """What ``make wheelhouse`` downloads with dependencies: the pinned dependencies and the build backend."""
    text = ((root or paths.repo_root()) / "pyproject.toml").read_text()
    build = re.search(r"^requires\s*=\s*\[(.*?)\]", text, flags=re.M)
    backend = re.findall(r'"([^"]+)"', build.group(1)) if build else []
    return [f"{name}=={pinned_version}" for name, pinned_version in _array(text, "dependencies")] + backend


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def differences(pins: dict[str, str]) -> list[str]:
    """What is missing or at another version, one line each; empty when everything matches."""
    out = []
    for name, wanted in sorted(pins.items()):
        have = _installed(name)
        if have is None:
            out.append(f"{name}=={wanted}: not installed")
        elif have.split("+")[0] != wanted:
            out.append(f"{name}=={wanted}: {have} installed")
    if _installed("packlab") is None:
        out.append("packlab (this course's package): not installed")
    return out


def conda_advice(root: Path | None = None, dev: bool = False) -> str:
    """The commands that bring a conda environment to the pins (what the Makefile will not do for it).

    ``dev``: the developers' environment (the book, the tests, DALI), ``environment-dev.yml``;
    otherwise the attendees', ``environment.yml``.
    """
    text = ((root or paths.repo_root()) / "pyproject.toml").read_text()
    no_deps = " ".join(f"{n}=={v}" for n, v in _array(text, "no-deps"))
    return ("This is a conda environment: the Makefile does not install into it. In it, run\n"
            f"  conda env update -f {'environment-dev.yml' if dev else 'environment.yml'}\n"
            f"  pip install --no-deps {no_deps}\n"
            "then the make command again.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.installed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dev", action="store_true", help="the dev and dali extras too (make setup-dev)")
    parser.add_argument("--wheelhouse-requirements", action="store_true",
                        help="instead: print what make wheelhouse downloads with dependencies, one per line")
    args = parser.parse_args(argv)
    if args.wheelhouse_requirements:
        print("\n".join(wheelhouse_requirements()))
        return 0
    missing = differences(pinned(dev=args.dev))
    if not missing:
        print(f"the pinned versions are installed in {sys.prefix}: nothing to install")
        return SATISFIED
    shown = "; ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
    print(f"{sys.prefix} differs from pyproject.toml: {shown}")
    if (Path(sys.prefix) / "conda-meta").is_dir():
        print(conda_advice(dev=args.dev))
        return CONDA
    return MISSING


if __name__ == "__main__":
    sys.exit(main())
