"""What the browser tests share: finding Chromium, and its command-line flags.

Chromium comes from Debian's ``chromium`` package, which ``make system-deps`` installs
before any test runs (:mod:`packlab.course.system_deps`; no test installs packages
itself). Without it the test skips with a message, except under ``CI=true``, where it
must run. A test module uses the fixture by importing it: ``from browser_support import
chromium``.
"""

from __future__ import annotations

import os
import shutil

import pytest

from packlab.course import system_deps

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
    """The path of a Chromium executable (``make system-deps`` installs Debian's chromium)."""
    found = find_chromium()
    if found:
        return found
    system_deps.require("chromium", skip=pytest.skip, fail=pytest.fail)
    unavailable("the chromium package is installed but no chromium executable is on PATH")
