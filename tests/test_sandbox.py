"""The sandbox the gradebook and the hub run untrusted code in: what it lets through, and what not.

Each test starts a short Python in a :class:`packlab.course.sandbox.Sandbox` and looks at
what it could do: write only where it was given a writable folder; read the folders it was
given, and nothing of a hidden one; no network; a memory limit per process; a time limit
that kills it and everything it started.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from packlab.course import sandbox, system_deps


@pytest.fixture(scope="module", autouse=True)
def bwrap_here():
    why = sandbox.why_unavailable()
    if why and "not installed" in why:
        system_deps.require("bubblewrap", skip=pytest.skip, fail=pytest.fail)
    elif why:
        pytest.skip(why)


def run(box: sandbox.Sandbox, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return sandbox.run(box, [sys.executable, "-c", code], timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)


def test_only_the_writable_folder_takes_writes_and_a_hidden_folder_is_empty(tmp_path):
    mine, theirs, hidden = tmp_path / "mine", tmp_path / "theirs", tmp_path / "theirs" / "class"
    for folder in (mine, hidden):
        folder.mkdir(parents=True)
    (theirs / "notes.txt").write_text("readable")
    (hidden / "other-attendee.md").write_text("private")
    code = f"""
import os
open({str(mine / 'a.txt')!r}, 'w').write('ok')
print(open({str(theirs / 'notes.txt')!r}).read())
print(sorted(os.listdir({str(hidden)!r})))
try:
    open({str(theirs / 'b.txt')!r}, 'w')
except OSError as exc:
    print(type(exc).__name__, exc.errno)
"""
    done = run(sandbox.Sandbox(readable=[theirs], writable=[mine], hidden=[hidden]), code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["readable", "[]", "OSError 30"], done.stdout  # 30: EROFS
    assert (mine / "a.txt").read_text() == "ok" and not (theirs / "b.txt").exists()


def test_no_network_but_a_loopback_of_its_own():
    code = """
import socket
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
socket.create_connection(server.getsockname(), timeout=5); print("loopback")
try:
    socket.create_connection(("1.1.1.1", 443), timeout=5)
except OSError as exc:
    print("outside:", type(exc).__name__)
"""
    done = run(sandbox.Sandbox(), code)
    assert done.stdout.splitlines() == ["loopback", "outside: OSError"], done.stdout + done.stderr


def test_a_process_cannot_take_more_memory_than_its_limit():
    code = "x = bytearray(3 * 1024**3)\nprint('allocated')"
    done = run(sandbox.Sandbox(memory_bytes=2 * 1024**3), code)
    assert "MemoryError" in done.stderr and "allocated" not in done.stdout


def test_the_time_limit_kills_the_sandbox_and_what_it_started():
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '600'])\ntime.sleep(600)"
    start = time.monotonic()
    done = run(sandbox.Sandbox(), code, timeout=3)
    assert done.returncode == -9 and time.monotonic() - start < 30
    leftovers = subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, text=True).stdout.split()
    assert not leftovers, "a process started in the sandbox outlived it"


def test_the_instructors_files_and_secrets_are_not_there():
    code = "import os\nprint(os.path.exists('/etc/shadow'), os.path.exists('/root/.ssh'), sorted(os.listdir('/')))"
    done = run(sandbox.Sandbox(), code)
    shadow, ssh, _ = done.stdout.split(" ", 2)
    assert (shadow, ssh) == ("False", "False"), done.stdout + done.stderr


def test_the_working_directory_that_python_m_puts_on_sys_path_is_not_shared(tmp_path, monkeypatch):
    """The class hub runs `python -m jupyterhub` in its own folder (passwords, homes): no sandbox may see it."""
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.chdir(hub)
    monkeypatch.syspath_prepend(str(hub))
    for share_course in (True, False):
        shared = sandbox.python_paths(share_course=share_course)
        assert all(hub != p and hub not in p.parents for p in shared), shared
