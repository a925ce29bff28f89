"""Run a command as an attendee would: a normal account, not root (``make test``'s normal-user phase).

Attendees run the course as themselves, with no ``sudo``. A course built and tested only as
root can need root without anyone noticing: a file written into ``/root`` or another home
folder, a cgroup, a port below 1024, ``ptrace`` on another account's process. This module
makes a throwaway account, runs a command under it, and removes it again::

    python -m packlab.course.attendee_account -- python -m packlab.course.doctor

What the account gets, and nothing more:

* its own home folder and data folder, under a fresh temporary folder (``PACKLAB_DATA``
  points there, so it generates and packs its own dataset);
* the checkout, read-only: it belongs to someone else, as a shared course folder on a
  hub would;
* the course's environment. Where the Python it was made from lives in a folder the
  account may not enter (on the course's test machine, pyenv's Python is under ``/root``,
  mode 700), the same interpreter is copied beside the account's home first, with a
  virtual environment that reads the course's installed packages; a laptop's Python is
  its owner's, so this stands in for nothing the attendee lacks.

Run as a normal user already, it creates no account and runs the command as that user.
The command's first output line is ``id``'s, so the log proves which account ran it.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

#: The throwaway account's name prefix (the process id follows, so parallel runs never share one).
ACCOUNT_PREFIX = "packlab-attendee"


def _enterable_by_others(path: Path) -> bool:
    """Whether an account other than the owner can reach ``path``: every folder above it has o+x."""
    for folder in [path, *path.parents]:
        try:
            mode = folder.stat().st_mode
        except OSError:
            return False
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return False
    return True


def create_account(home: Path) -> pwd.struct_passwd:
    """A new account with ``home`` as its home folder (``useradd``; root only)."""
    name = f"{ACCOUNT_PREFIX}-{os.getpid()}"
    subprocess.run(["useradd", "--home-dir", str(home), "--create-home", "--shell", "/bin/bash",
                    "--user-group", name], check=True)
    return pwd.getpwnam(name)


def remove_account(account: pwd.struct_passwd) -> None:
    """Remove the account and end anything it left running."""
    if shutil.which("pkill"):  # procps; userdel --force removes the account even with processes left
        subprocess.run(["pkill", "-KILL", "-u", account.pw_name], check=False)
    subprocess.run(["userdel", "--force", account.pw_name], check=False, capture_output=True)


def readable_python(into: Path) -> tuple[Path, dict[str, str]]:
    """A Python the account can run, with the course's packages: ``(executable, environment additions)``.

    This environment's own interpreter when the account can reach it; otherwise a copy of
    the interpreter and its standard library under ``into``, wrapped in a virtual
    environment whose ``site-packages`` is the course environment's (a link, read-only).
    """
    executable = Path(sys.executable)
    base = Path(sys.base_prefix)
    if _enterable_by_others(base) and _enterable_by_others(executable.parent):
        return executable, {}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python_home = into / "python"
    (python_home / "bin").mkdir(parents=True)
    (python_home / "lib").mkdir()
    shutil.copy2(base / "bin" / version, python_home / "bin" / version)
    for library in (base / "lib").glob("libpython*"):
        shutil.copy2(library, python_home / "lib" / library.name, follow_symlinks=False)
    shutil.copytree(base / "lib" / version, python_home / "lib" / version,
                    ignore=shutil.ignore_patterns("site-packages", "test", "__pycache__"), symlinks=True)
    venv = into / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / version).mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(python_home / "bin" / version)
    (venv / "lib" / version / "site-packages").symlink_to(Path(sysconfig.get_paths()["purelib"]))
    (venv / "pyvenv.cfg").write_text(f"home = {python_home / 'bin'}\ninclude-system-site-packages = false\n"
                                     f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    for entry in Path(sys.prefix).iterdir():  # share/ (JupyterLab's extensions), make setup's records
        if entry.name not in ("bin", "lib", "lib64", "pyvenv.cfg"):
            (venv / entry.name).symlink_to(entry)
    _carry_programs(executable.parent, venv / "bin")
    # The interpreter's RUNPATH names the original lib folder; LD_LIBRARY_PATH wins over a RUNPATH.
    return venv / "bin" / "python", {"LD_LIBRARY_PATH": str(python_home / "lib")}


def _carry_programs(source: Path, target: Path) -> None:
    """The environment's programs (``weed``, ``py-spy``, ``torchrun`` ...) in ``target``, as the chapters find them.

    Binaries are linked. Scripts start with a ``#!`` line naming the environment's Python,
    which the account cannot run, so each is copied with that line naming ``target``'s.
    """
    shebang = f"#!{source / 'python'}".encode()
    for program in source.iterdir():
        if program.name.startswith("python") or (target / program.name).exists() or not program.is_file():
            continue
        with open(program, "rb") as head:
            first = head.readline()
        if first.startswith(shebang):
            rest = program.read_bytes().split(b"\n", 1)[1]
            (target / program.name).write_bytes(f"#!{target / 'python'}\n".encode() + rest)
            (target / program.name).chmod(0o755)
        else:
            (target / program.name).symlink_to(program)


def run_as_attendee(command: list[str], keep_env: tuple[str, ...] = ()) -> int:
    """Run ``command`` under a throwaway normal account (or as this user, when not root); return its exit status.

    ``python`` as the command's first word means the course's Python as the account can run
    it. The environment is a login's (``HOME``, ``USER``, ``PATH``) plus ``PACKLAB_DATA`` in
    the account's own folder and the variables named in ``keep_env``.
    """
    root = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    top = Path(tempfile.mkdtemp(prefix="packlab-attendee-"))
    top.chmod(0o755)
    account = None
    try:
        home = top / "home"
        if root:
            account = create_account(home)
        else:
            home.mkdir()
        python, extra = readable_python(top)
        data = top / "data"
        data.mkdir()
        env = {"HOME": str(home), "USER": account.pw_name if account else os.environ.get("USER", ""),
               "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "PACKLAB_DATA": str(data), "PYTHONUNBUFFERED": "1", **extra}
        env.update({name: os.environ[name] for name in keep_env if name in os.environ})
        argv = [str(python) if word == "python" else word for word in command]
        if account is not None:
            for path in (home, data):
                shutil.chown(path, account.pw_uid, account.pw_gid)
            argv = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups",
                    "--reset-env", "--", "env", *[f"{k}={v}" for k, v in env.items()], *argv]
            env = None
        print("the attendee's account:", subprocess.run(
            (["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups", "--", "id"]
             if account else ["id"]), capture_output=True, text=True).stdout.strip(), flush=True)
        return subprocess.run(argv, cwd=Path.cwd(), env=env).returncode
    finally:
        if account is not None:
            remove_account(account)
        shutil.rmtree(top, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.attendee_account",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-env", default="", help="comma-separated variables to pass on (PACKLAB_COUNT, ...)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --; 'python' is the course's")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    return run_as_attendee(command, tuple(name for name in args.keep_env.split(",") if name))


if __name__ == "__main__":
    sys.exit(main())
