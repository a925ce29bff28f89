"""The gradebook cannot be harmed: hostile notebooks are contained, or score 0, with a note saying so.

Three attendees hand in exercise 5 with something else in it:

* **dora** solves it, and her notebook also tries to read a file of the instructor's,
  another attendee's notebook, and to write beside them, into the course and into the
  dataset. Each attempt fails inside the sandbox; her solution still scores in full, and
  the gradebook names the cells that raised;
* **eli** solves it, and his notebook opens sockets: to a server of the instructor's on
  this machine and to an address outside. Neither connects (the server counts no
  connection); the solution scores in full;
* **finn** leaves the stub and forges his results: he calls the recording function with
  a result whose every part passed, and writes such a line into the results file himself.
  He scores 0, and the gradebook says that his notebook recorded passes the grader's own
  run did not find.

They are graded three at a time (``--jobs 3``), each in its own sandbox.
"""

from __future__ import annotations

import csv
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from grading_support import NOTEBOOK_HEADER, SOLVED_SHARD_SPLIT

from packlab import paths
from packlab.course import sandbox

HEADER = NOTEBOOK_HEADER
SOLVED = SOLVED_SHARD_SPLIT
CHECK = '''
```{code-cell} ipython3
result = check("shard_split", shards_for)
```
'''


def cell(code: str) -> str:
    return f"\n```{{code-cell}} ipython3\n{code.strip()}\n```\n"


def reader(secret: Path, other: Path, outside: Path) -> str:
    return HEADER + SOLVED + CHECK + "".join(cell(code) for code in (
        f"print(open({str(secret)!r}).read())",
        f"print(open({str(other)!r}).read())",
        f"open({str(outside / 'written-by-dora.txt')!r}, 'w').write('pwned')",
        f"open({str(paths.repo_root() / 'written-by-dora.txt')!r}, 'w').write('pwned')",
        f"open({str(paths.images_dir() / 'written-by-dora.jpg')!r}, 'w').write('pwned')",
    ))


def opener(port: int) -> str:
    return HEADER + SOLVED + CHECK + "".join(cell(code) for code in (
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=10).sendall(b'from eli')",
        "import socket\nsocket.create_connection(('1.1.1.1', 443), timeout=10)",
    ))


FORGER = HEADER + '''
```{code-cell} ipython3
from packlab.course.grading import check
```

```{code-cell} ipython3
def shards_for(shards, rank, world_size, worker_id, num_workers):
    raise NotImplementedError("your code here")
```

```{code-cell} ipython3
import json, os
from packlab.course.grading import core
info = {c.id: c for c in core.list_checks()}["shard_split"]
forged = core.CheckResult("shard_split", "shards_for",
                          [core.PartResult(name, "", True, "ok", "") for name in info.parts], 1.0)
core._record(forged, "05_shard_split")
with open(os.environ[core.RESULTS_ENV_VAR], "a") as f:
    f.write(json.dumps({**forged.to_dict(), "notebook": "05_shard_split"}) + "\\n")
```
''' + CHECK


class CountingServer:
    """A TCP server of the instructor's on this machine that counts the connections it accepts."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen()
        self.socket.settimeout(0.5)
        self.port = self.socket.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                connection, _ = self.socket.accept()
            except OSError:
                continue
            self.accepted += 1
            connection.close()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.socket.close()


def test_hostile_notebooks_are_contained_or_score_zero_with_a_note(tmp_path):
    if why := sandbox.why_unavailable():
        if "not installed" in why:
            from packlab.course import system_deps

            system_deps.require("bubblewrap", skip=pytest.skip, fail=pytest.fail)
        pytest.skip(why)
    instructor = tmp_path / "instructor"
    instructor.mkdir()
    secret = instructor / "secret.txt"
    secret.write_text("the instructor's secret")
    folder = tmp_path / "class"
    server = CountingServer()
    try:
        notebooks = {
            "dora": reader(secret, folder / "eli" / "exercises" / "05_shard_split.md", instructor),
            "eli": opener(server.port),
            "finn": FORGER,
        }
        for attendee, text in notebooks.items():
            (folder / attendee / "exercises").mkdir(parents=True)
            (folder / attendee / "exercises" / "05_shard_split.md").write_text(text)
        run = subprocess.run(
            [sys.executable, "-m", "packlab.course.grade", "--class", str(folder), "--jobs", "3", "--cell-timeout", "120",
             "--notebook-timeout", "600", "--exercises", "05_shard_split"],
            capture_output=True, text=True, timeout=1200,
        )
    finally:
        server.close()
    assert run.returncode == 0, run.stderr + run.stdout
    with open(folder / "gradebook.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    score = {r["attendee"]: (r["passed"], r["max"]) for r in rows if r["exercise"] == "05_shard_split" and r["check"] == "ALL"}
    notes = {r["attendee"]: r["note"] for r in rows if r["exercise"] == "05_shard_split" and r["check"] == "ALL"}
    split = {r["attendee"]: sum(int(x["passed"]) for x in rows if x["attendee"] == r["attendee"] and x["check"] == "shard_split")
             for r in rows}

    # dora: nothing outside her folder was read or written; her solution counts; the note names each blocked cell.
    assert not (instructor / "written-by-dora.txt").exists()
    assert not (paths.repo_root() / "written-by-dora.txt").exists()
    assert not (paths.images_dir() / "written-by-dora.jpg").exists()
    assert split["dora"] == 5, notes["dora"]
    for blocked in ("FileNotFoundError", "Read-only file system"):
        assert blocked in notes["dora"], notes["dora"]
    assert notes["dora"].count("cells that raised") == 1 and len(notes["dora"].split("), ")) >= 5, notes["dora"]

    # eli: no connection reached the instructor's server, nor left the machine; his solution counts.
    assert server.accepted == 0
    assert split["eli"] == 5, notes["eli"]
    assert "ConnectionRefusedError" in notes["eli"] and "OSError" in notes["eli"], notes["eli"]

    # finn: the forged passes do not count, and the note says so.
    assert split["finn"] == 0 and score["finn"][0] == "0", score
    assert "5 passed parts were recorded for it" in notes["finn"] and "found 0" in notes["finn"], notes["finn"]
    assert "3 at a time, each in a sandbox" in run.stdout
