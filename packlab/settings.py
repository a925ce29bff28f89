"""This checkout's settings: one file that ``make`` and ``packlab`` both read.

The settings change where and how much the course writes, how many cores it uses, and
where a laptop room's board is. Typed on a command line or
exported in one terminal, they are gone in the next one, and what is forgotten costs
dearly: the full dataset regenerated on a small quota, a second environment in a home
folder, gigabytes in the clone. So they live in a file, ``settings.mk`` in the
repository root (git-ignored), that ``make configure`` writes::

    make configure PACKLAB_COUNT=2000 PACKLAB_DATA=/scratch/$USER/packed-data
    make configure VENV=/scratch/$USER/packed-venv TORCH_BACKEND=cpu
    make configure PACKLAB_COUNT=          # an empty value removes a setting

The file is Makefile syntax, ``NAME ?= value`` per line, so the Makefile reads it with
``-include`` and this module parses the same lines. ``?=`` keeps the order of precedence
the same in both: a value on the command line or in the environment wins over the file,
and the file over the built-in default. :func:`lookup` says which one a value came from
(``make doctor`` prints it).

* ``PACKLAB_COUNT``: images in the dataset (small-data mode: 2000), read by :mod:`packlab.data`;
* ``PACKLAB_DATA``: the data folder, read by :mod:`packlab.paths`;
* ``VENV``: the environment folder (a conda environment's prefix works too), read by the Makefile;
* ``TORCH_BACKEND``: where torch comes from (``cpu``: PyTorch's CPU wheels; ``pypi``: PyPI's build),
  read by the Makefile when it creates the environment;
* ``PACKLAB_CORES``: the most cores the course uses (workers, processes), read by
  :func:`packlab.cpus.course_cores`; the class hub and the cluster recipes set it to an
  attendee's share (default: every core this process may run on);
* ``PACKLAB_CLASS_URL`` and ``PACKLAB_CLASS_TOKEN``: the instructor's class board in a laptop
  room (``make board BOARD_HOST=0.0.0.0`` prints both), read by :mod:`packlab.course.hub.post`:
  every check also posts its records there (default: not set, nothing is sent).

``PACKLAB_SETTINGS`` names another settings file (the tests use it to run without one).
Nothing here imports more than the standard library: ``make configure`` runs it with the
machine's ``python3`` before any environment exists.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

#: The settings file's name in the repository root.
SETTINGS_FILE = "settings.mk"
#: Environment variable naming another settings file (tests point it at an empty folder).
SETTINGS_ENV_VAR = "PACKLAB_SETTINGS"
#: Every setting the file may hold, and what it is for (the file's comments say the same).
KNOWN = {
    "PACKLAB_COUNT": "images in the dataset (small-data mode: 2000; default 10000)",
    "PACKLAB_DATA": "the data folder: the dataset and the packed copies (default: data/ in the repository)",
    "VENV": "the environment folder, or an active conda environment's $CONDA_PREFIX (default: .venv)",
    "TORCH_BACKEND": "where torch comes from: cpu (PyTorch's CPU wheels), pypi (PyPI's build), or any uv --torch-backend",
    "PACKLAB_CORES": "the most cores the course uses for its workers (default: every core this process may run on)",
    "PACKLAB_CLASS_URL": "the class board every check also posts its records to, http://host:port (make board prints it)",
    "PACKLAB_CLASS_TOKEN": "the class board's token (make board prints it)",
}
#: What each setting is when nothing sets it (the Makefile and packlab.data, packlab.paths decide the same).
DEFAULTS = {
    "PACKLAB_COUNT": "10000",
    "PACKLAB_DATA": "data/ in the repository",
    "VENV": ".venv",
    "TORCH_BACKEND": "cpu" if sys.platform.startswith("linux") else "pypi",  # the Makefile's: cpu on Linux
    "PACKLAB_CORES": "every core this process may run on",
    "PACKLAB_CLASS_URL": "not set: checks are sent to no board",
    "PACKLAB_CLASS_TOKEN": "not set",
}
#: Settings that hold a folder: written as absolute paths, so they mean the same from any directory.
FOLDERS = ("PACKLAB_DATA", "VENV")
_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(\?=|:=|=)\s*(.*?)\s*$")


class SettingsError(ValueError):
    """The settings file has a line this module cannot read; the message names the file and the line."""


@dataclass(frozen=True)
class Setting:
    """A setting's value and where it came from: ``environment``, the settings file's path, or ``default``."""

    name: str
    value: str | None
    source: str

    def origin(self) -> str:
        """Where the value came from, in words."""
        return {"environment": "from the environment or the command line", "default": "the default"}.get(
            self.source, f"from {self.source}")

    def describe(self) -> str:
        shown = self.value if self.value is not None else "(not set)"
        return f"{self.name}={shown} ({self.origin()})"


def settings_path() -> Path:
    """The settings file: ``$PACKLAB_SETTINGS`` when set, else ``settings.mk`` in the repository root."""
    configured = os.environ.get(SETTINGS_ENV_VAR)
    # The repository root as packlab.paths.repo_root() finds it (paths imports this module, not the reverse).
    return Path(configured).expanduser() if configured else Path(__file__).resolve().parent.parent / SETTINGS_FILE


def read_file(path: Path | None = None) -> dict[str, str]:
    """The settings in ``path`` (default :func:`settings_path`): ``{name: value}``; empty if there is no file.

    Comments (``#``) and blank lines are skipped; any other line must be ``NAME ?= value``
    (or ``=``, ``:=``) with a name from :data:`KNOWN`, else :class:`SettingsError` names the
    file and the line, and says how to rewrite it.
    """
    path = path or settings_path()
    try:
        stamp = path.stat()
    except FileNotFoundError:
        return {}
    key = (str(path), stamp.st_mtime_ns, stamp.st_size)
    if key not in _parsed:  # paths.data_root() asks on every call: parse a file once per version of it
        _parsed.clear()
        _parsed[key] = _parse(path, path.read_text())
    return dict(_parsed[key])


_parsed: dict[tuple, dict[str, str]] = {}


def _parse(path: Path, text: str) -> dict[str, str]:
    found = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line)
        if not match or match.group(1) not in KNOWN:
            raise SettingsError(
                f"{path}, line {number}: {line.strip()!r} is not a course setting "
                f"(known: {', '.join(KNOWN)}); rewrite the file with `make configure NAME=value`, or delete it")
        found[match.group(1)] = match.group(3)
    return found


def lookup(name: str, default: str | None = None) -> Setting:
    """``name``'s value: from the environment when set there (not empty), else the settings file, else ``default``."""
    value = os.environ.get(name, "").strip()
    if value:
        return Setting(name, value, "environment")
    in_file = read_file().get(name, "")
    if in_file:
        return Setting(name, in_file, str(settings_path()))
    return Setting(name, default, "default")


def configured(name: str, value: str) -> str:
    """The value as the file stores it: folders made absolute (``~`` expanded), everything else as given."""
    if name in FOLDERS and value:
        return str(Path(value).expanduser().absolute())
    return value


def write(changes: dict[str, str], path: Path | None = None) -> dict[str, str]:
    """Apply ``changes`` to the settings file (an empty value removes a setting); return what it now holds."""
    path = path or settings_path()
    unknown = sorted(set(changes) - set(KNOWN))
    if unknown:
        raise SettingsError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(KNOWN)}")
    current = read_file(path)
    for name, value in changes.items():
        if value.strip():
            current[name] = configured(name, value.strip())
        else:
            current.pop(name, None)
    if not current:  # nothing left to set: no file, as on a fresh clone
        path.unlink(missing_ok=True)
        return current
    lines = ["# This checkout's course settings, written by `make configure NAME=value ...` (git-ignored).",
             "# Read by the Makefile (-include) and by packlab (packlab/settings.py); a value set on the",
             "# command line or in the environment wins over the one here (hence ?=).", ""]
    for name in KNOWN:
        if name in current:
            lines += [f"# {KNOWN[name]}", f"{name} ?= {current[name]}"]
    path.write_text("\n".join(lines) + "\n")
    return current


def report() -> str:
    """Every setting, its value and its source, one per line (``make configure`` prints it)."""
    return "\n".join("  " + lookup(name, DEFAULTS[name]).describe() for name in KNOWN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.settings", description=__doc__.split("\n\n")[0])
    parser.add_argument("changes", nargs="*", metavar="NAME=value",
                        help=f"settings to write ({', '.join(KNOWN)}); an empty value removes one")
    args = parser.parse_args(argv)
    changes = {}
    for item in args.changes:
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"{item!r}: write NAME=value")
        changes[name.strip()] = value
    try:
        if changes:
            write(changes)
            print(f"wrote {settings_path()}")
        print(f"course settings (a value from the environment or the command line wins over {settings_path().name}):")
        print(report())
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
