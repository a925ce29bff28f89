"""What the browser tests share: finding (or installing) Chromium, and its command-line flags.

Chromium comes from Debian's ``chromium`` package; the ``chromium`` fixture installs it
when it is missing and it may (root with apt-get). Otherwise the test skips with a
message, except under ``CI=true``, where it must run. A test module uses the fixture by
importing it: ``from browser_support import chromium``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile

import pytest

#: Flags for headless Chromium on a machine without a display, a sandbox or the internet.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def unavailable(reason: str):
    """Skip with ``reason``, or fail under ``CI=true``, where the browser tests must run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (under CI=true the browser check must run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> str:
    """The path of a Chromium executable, installed with apt-get if needed and possible."""
    found = find_chromium()
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        unavailable("Chromium is not installed and cannot be installed here (needs Debian's apt-get as root)")
    # make test runs the browser test files in two processes at once: the first to get here
    # installs, the other waits for it and then finds Chromium (two apt-gets at once fail
    # on apt's own lock).
    with open(os.path.join(tempfile.gettempdir(), "packlab-chromium-install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find_chromium()
        if found:
            return found
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                unavailable(f"installing Chromium failed: {' '.join(cmd)}: {done.stderr.strip()[-500:]}")
    found = find_chromium()
    if not found:
        unavailable("apt-get installed chromium but no chromium executable is on PATH")
    return found
