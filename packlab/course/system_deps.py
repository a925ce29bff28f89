"""The Debian packages the tests need, installed once, before any test runs.

``make test`` runs its phases side by side (``packlab.course.testrun``): if two tests each
ran ``apt-get`` when they found a program missing, the second would fail on dpkg's lock
(``Could not get lock /var/lib/dpkg/lock-frontend``). So no test installs anything. This
step, ``make system-deps`` (which ``make test`` calls first), looks for each package's
programs, installs the missing packages with one ``apt-get update`` and one ``apt-get
install``, and says what it installed. Run again, it finds everything and does nothing.

When it cannot install (not root, no ``apt-get``, ``apt-get`` failed) it says so and which
tests will not run; the tests that need a missing program then skip with a message that
points here, except under ``CI=true``, where this step fails (exit status 1) and so do those
tests: CI must run every test.

``python -m packlab.course.system_deps --check`` only reports; ``--list`` prints the packages.
``--hub`` (``make system-deps HUB=1``) takes only what the class hub needs (bubblewrap, for
the attendees' sandboxes), and prints the command that installs it by hand on Debian and
Ubuntu and on RHEL, Rocky and Alma (``dnf``), where this step cannot install.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class SystemPackage:
    """A Debian package, the programs that show it is installed, and the tests that need it."""

    name: str
    programs: tuple[str, ...]
    needed_by: str
    #: Whether the class hub needs it (``--hub``).
    hub: bool = False
    #: Its name in RHEL's and Rocky's repositories (``dnf``), where the hub may run; "" when not given.
    dnf_name: str = ""


#: Every Debian package a test needs. Add a row here (never an ``apt-get`` in a test).
PACKAGES = (
    SystemPackage("chromium", ("chromium",), "the browser tests (the book, JupyterLab)"),
    SystemPackage("slurm-wlm", ("sbatch", "slurmctld", "slurmd", "scontrol"), "the Slurm job tests"),
    SystemPackage("munge", ("munged", "mungekey"), "the Slurm job tests"),
    SystemPackage("bubblewrap", ("bwrap",), "the gradebook's sandbox and the class hub (packlab.course.sandbox)",
                  hub=True, dnf_name="bubblewrap"),
)


def hub_packages() -> tuple[SystemPackage, ...]:
    """What the class hub needs of :data:`PACKAGES` (``make system-deps HUB=1``)."""
    return tuple(p for p in PACKAGES if p.hub)


def by_hand(packages) -> list[str]:
    """The commands that install ``packages`` by hand: Debian's and Ubuntu's, and RHEL's and Rocky's where named."""
    lines = [f"Debian, Ubuntu:     sudo apt-get install --no-install-recommends {' '.join(p.name for p in packages)}"]
    dnf = [p.dnf_name for p in packages if p.dnf_name]
    if len(dnf) == len(packages):
        lines.append(f"RHEL, Rocky, Alma:  sudo dnf install {' '.join(dnf)}")
    return lines

#: What apt-get is given: no questions asked, no recommended extras.
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
INSTALL_TIMEOUT = 1800  # seconds: Chromium and Slurm together are a few hundred MB on a slow mirror


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def is_installed(package: SystemPackage) -> bool:
    """Whether every program of ``package`` is on PATH (what the tests look for, too)."""
    return all(shutil.which(program) for program in package.programs)


def missing(packages=PACKAGES) -> list[SystemPackage]:
    return [p for p in packages if not is_installed(p)]


def find(name: str) -> SystemPackage:
    """The row of :data:`PACKAGES` called ``name``."""
    for package in PACKAGES:
        if package.name == name:
            return package
    raise KeyError(f"{name!r} is not in packlab.course.system_deps.PACKAGES")


def why_cannot_install() -> str | None:
    """Why this machine cannot run apt-get, or None when it can."""
    if shutil.which("apt-get") is None:
        return "there is no apt-get on this machine (the tests' system packages come from Debian or Ubuntu)"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "apt-get needs root: run `sudo make system-deps` once"
    return None


def _apt(args: list[str], log) -> subprocess.CompletedProcess:
    print(f"  $ apt-get {' '.join(args)}", file=log, flush=True)
    return subprocess.run(["apt-get", *args], env={**os.environ, **APT_ENV}, capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT)


def install(packages: list[SystemPackage], log=sys.stdout) -> tuple[bool, str]:
    """``apt-get update`` then one ``apt-get install`` of ``packages``; (succeeded, message)."""
    names = [p.name for p in packages]
    update = _apt(["update", "-q"], log)
    if update.returncode != 0:
        return False, f"apt-get update failed (exit {update.returncode}):\n{update.stderr.strip()[-1500:]}"
    done = _apt(["install", "-y", "-q", "--no-install-recommends", *names], log)
    if done.returncode != 0:
        return False, f"apt-get install {' '.join(names)} failed (exit {done.returncode}):\n{done.stderr.strip()[-1500:]}"
    still = [p.name for p in packages if not is_installed(p)]
    if still:
        return False, f"apt-get installed {' '.join(names)}, yet the programs of {', '.join(still)} are not on PATH"
    return True, f"installed {', '.join(names)}"


def ensure(packages=PACKAGES, log=sys.stdout) -> int:
    """Install what is missing of ``packages``; the exit status ``make system-deps`` returns."""
    needed = missing(packages)
    if not needed:
        print(f"system packages: all present ({', '.join(p.name for p in packages)})", file=log)
        return 0
    print(f"system packages missing: {', '.join(p.name for p in needed)}", file=log, flush=True)
    reason = why_cannot_install()
    if reason is None:
        ok, message = install(needed, log)
        if ok:
            print(f"system packages: {message}", file=log)
            return 0
        reason = message
    for package in needed:
        print(f"  without {package.name}: {package.needed_by} will not run", file=log)
    if in_ci():
        print(f"cannot install them: {reason}\nUnder CI=true every test must run: failing.", file=log)
        return 1
    print(f"cannot install them: {reason}\nThose tests will be skipped, each with this reason.", file=log)
    return 0


def require(name: str, skip, fail) -> None:
    """In a test: go on if package ``name`` is installed, else ``skip(reason)``, or ``fail`` under CI=true.

    ``skip`` and ``fail`` are ``pytest.skip`` and ``pytest.fail``; passed in so that this
    module does not import pytest.
    """
    package = find(name)
    if is_installed(package):
        return
    absent = [program for program in package.programs if not shutil.which(program)]
    reason = (f"Debian's {package.name} is not installed ({', '.join(absent)} not on PATH): "
              f"`make system-deps` installs it (make test runs it first)")
    if in_ci():
        fail(f"{reason}; under CI=true this test must run")
    skip(reason)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.system_deps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report what is missing (exit 1 if anything is)")
    parser.add_argument("--list", action="store_true", help="print the package names, one per line")
    parser.add_argument("--hub", action="store_true", help="only what the class hub needs (bubblewrap)")
    args = parser.parse_args(argv)
    packages = hub_packages() if args.hub else PACKAGES
    if args.list:
        print("\n".join(p.name for p in packages))
        return 0
    if args.check:
        absent = missing(packages)
        for package in packages:
            state = "missing" if package in absent else "present"
            print(f"{package.name:<10} {state:<8} ({', '.join(package.programs)}) for {package.needed_by}")
        return 1 if absent else 0
    if args.hub:
        print("the class hub needs " + ", ".join(p.name for p in packages) + "; by hand, as root:")
        print("\n".join(f"  {line}" for line in by_hand(packages)), flush=True)
    return ensure(packages)


if __name__ == "__main__":
    sys.exit(main())
