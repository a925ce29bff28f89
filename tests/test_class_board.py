"""The class board in a laptop room: checks posted over the network, with a token, queued while it is down.

The board (:mod:`packlab.course.hub.board`) runs here on 127.0.0.1 on a free port, in a
thread, as ``make board BOARD_HOST=...`` serves it beyond loopback (the page wants the
token). Three "clones" (ana, ben, chen: each its own settings file naming the board, its
own user name and its own queue in ``mywork/``) run a real ``check()`` and a
``checkpoint()``; the board's folder then holds all three, in the hub's layout, and its
page and ``data.json`` list them. A wrong token is refused; a board that is down, or one
that accepts the connection and never answers, costs a post at most its one-second limit
(asserted against a generous bound: a guard against hanging, not a benchmark), and the
record waits in the queue until the board is back.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from browser_support import CHROMIUM_FLAGS, chromium  # noqa: F401 - the shared fixture

from packlab import settings
from packlab.course import check, checkpoint
from packlab.course.grading import records
from packlab.course.hub import board, post

TOKEN = "class-token-for-tests"
#: The most a post to a board that is down or hung may take: its limit is post.TIMEOUT (1 s).
HANG_GUARD = 3.0


def shards_for(shards, rank, world_size, worker_id, num_workers):
    if len(shards) < world_size * num_workers:
        raise ValueError(f"{len(shards)} shards for {world_size * num_workers} readers")
    return list(shards[rank::world_size][worker_id::num_workers])


def shards_for_never_raises(shards, rank, world_size, worker_id, num_workers):
    return list(shards[rank::world_size][worker_id::num_workers])


def shards_for_stub(shards, rank, world_size, worker_id, num_workers):
    raise NotImplementedError("your code here")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BoardThread:
    """The board's tornado app on 127.0.0.1:port in a thread of its own, the page behind the token."""

    def __init__(self, folder: Path, port: int):
        self.folder, self.port = folder, port
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> BoardThread:
        from tornado.ioloop import IOLoop

        ready = threading.Event()

        def run():
            asyncio.set_event_loop(asyncio.new_event_loop())
            self.loop = IOLoop.current()
            app = board.make_app(self.folder, None, "/", token=TOKEN, page_token=True)
            self.server = app.listen(self.port, address="127.0.0.1", max_body_size=2 * board.MAX_BODY)
            ready.set()
            self.loop.start()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(30), "the board did not start"
        return self

    def stop(self) -> None:
        def halt():
            self.server.stop()
            self.loop.stop()

        self.loop.add_callback(halt)
        self.thread.join(30)


@pytest.fixture
def live_board(tmp_path):
    running = BoardThread(tmp_path / "board-records", free_port()).start()
    yield running
    running.stop()


@contextmanager
def clone(monkeypatch, tmp_path: Path, user: str, url: str):
    """An attendee's checkout: its own settings file naming the board, its user name, its queue."""
    home = tmp_path / user
    home.mkdir(exist_ok=True)
    settings.write({post.URL_SETTING: url, post.TOKEN_SETTING: TOKEN}, home / "settings.mk")
    with monkeypatch.context() as m:
        m.setenv(settings.SETTINGS_ENV_VAR, str(home / "settings.mk"))
        m.setenv("PACKLAB_USER", user)
        for name in (post.URL_SETTING, post.TOKEN_SETTING, records.CLASS_RECORDS_ENV_VAR):
            m.delenv(name, raising=False)
        m.setattr(post, "queue_file", lambda: home / "mywork" / post.QUEUE_NAME)
        yield home / "mywork" / post.QUEUE_NAME


def fetch(url: str, token: str | None = TOKEN, data: bytes | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def queued(queue: Path) -> list[dict]:
    return [json.loads(line) for line in queue.read_text().splitlines()] if queue.exists() else []


def test_three_clones_post_their_checks_and_checkpoints_and_the_board_shows_all_three(live_board, tmp_path, monkeypatch):
    attempts = {"ana": shards_for, "ben": shards_for_never_raises, "chen": shards_for_stub}
    for user, candidate in attempts.items():
        with clone(monkeypatch, tmp_path, user, live_board.url) as queue:
            check("shard_split", candidate, quiet=True)
            if user != "chen":
                checkpoint("ch05-split")
            assert not queue.exists(), f"{user}'s records were delivered, none waits"
    folder = live_board.folder
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jsonl")) == [
        "ana/ana.jsonl", "ben/ben.jsonl", "chen/chen.jsonl"]  # the hub's layout
    status, body = fetch(live_board.url + "/data.json")
    assert status == 200
    data = json.loads(body)
    too_few = next(p for p in data["parts"] if p["part"] == "too_few_shards")
    assert (too_few["passed"], too_few["failed"], too_few["not_started"]) == (["ana"], ["ben"], ["chen"])
    assert data["checkpoints"] == ["ch05-split"]
    assert {a["user"]: sorted(a["reached"]) for a in data["attendees"]} == {
        "ana": ["ch05-split"], "ben": ["ch05-split"], "chen": []}
    status, page = fetch(live_board.url + "/")
    assert status == 200
    text = page.decode()
    for user in attempts:
        assert f"data-user='{user}'" in text
    assert "PACKLAB_CLASS_URL=http://127.0.0.1" in text and TOKEN not in text  # how to join, never the token


def test_the_board_refuses_a_wrong_token_and_says_what_is_wrong_with_a_record(live_board):
    record = {"user": "ana", "notebook": "05_shard_split", "check": "shard_split", "part": "pure",
              "status": "passed", "seconds": 0.1, "time": "2026-11-28T10:31:02+00:00", "run": "ana-1-abc"}
    url = live_board.url + "/records"
    assert fetch(url, token="not-the-token", data=json.dumps(record).encode())[0] == 401
    assert fetch(url, token=None, data=json.dumps(record).encode())[0] == 401
    for bad, says in [({**record, "user": "../etc"}, b"'user'"), ({**record, "status": "great"}, b"'status'"),
                      ({**record, "time": "2026-11-28T10:31:02"}, b"time zone"), ([], b"1 to"),
                      ({k: v for k, v in record.items() if k != "run"}, b"'run'")]:
        status, message = fetch(url, data=json.dumps(bad).encode())
        assert (status, says in message) == (400, True), message
    assert fetch(url, data=b"not json")[0] == 400
    assert fetch(url, data=b" " * (board.MAX_BODY + 1))[0] == 413
    assert not list(live_board.folder.rglob("*.jsonl")), "nothing refused was stored"
    assert json.loads(fetch(url, data=json.dumps(record).encode())[1]) == {"stored": 1, "already_stored": 0}
    # Sent again (late, then from the queue): the board keeps one.
    assert json.loads(fetch(url, data=json.dumps([record]).encode())[1]) == {"stored": 0, "already_stored": 1}
    assert len(records.read_records(live_board.folder)) == 1
    # The page and its data beyond loopback: the token once in the address, then a cookie.
    assert fetch(live_board.url + "/", token=None)[0] == 401
    assert b"?token=" in fetch(live_board.url + "/data.json", token=None)[1]
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with opener.open(f"{live_board.url}/?token={TOKEN}", timeout=30) as response:
        assert response.status == 200 and response.url == live_board.url + "/"  # the token left the address bar
    with opener.open(live_board.url + "/data.json", timeout=30) as response:
        assert json.loads(response.read())["attendees"][0]["user"] == "ana"


@contextmanager
def hung_server():
    """A port that takes connections into its backlog and never reads them: a board that hangs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_board_that_is_down_or_hung_costs_a_post_its_limit_and_the_record_waits_for_it(tmp_path, monkeypatch):
    port = free_port()  # nobody listens here until the board starts
    url = f"http://127.0.0.1:{port}"
    took = {}
    with clone(monkeypatch, tmp_path, "dan", url) as queue:
        start = time.perf_counter()
        checkpoint("ch07-down")
        took["down"] = time.perf_counter() - start
        assert [e["checkpoint"] for e in queued(queue)] == ["ch07-down"]
    with hung_server() as hung, clone(monkeypatch, tmp_path, "dan", hung) as queue:
        start = time.perf_counter()
        checkpoint("ch07-hung")
        took["hung"] = time.perf_counter() - start
        assert [e["checkpoint"] for e in queued(queue)] == ["ch07-down", "ch07-hung"]
        assert check("shard_split", shards_for, parts="pure", quiet=True).passed  # the verdict, board or no board
        assert [e.get("part") for e in queued(queue)][-1] == "pure"
    print(f"a post took {took['down']:.2f} s to a closed port and {took['hung']:.2f} s to a hung one "
          f"(limit {post.TIMEOUT} s)")
    assert max(took.values()) <= HANG_GUARD, took
    running = BoardThread(tmp_path / "board-records", port).start()
    try:
        with clone(monkeypatch, tmp_path, "dan", url) as queue:
            checkpoint("ch07-back")
            assert not queue.exists(), "the queue went out with the next post that got through"
        delivered = records.read_records(running.folder)
        assert [e.get("checkpoint", e.get("part")) for e in delivered] == ["ch07-down", "ch07-hung", "pure", "ch07-back"]
    finally:
        running.stop()


def test_posting_never_raises_and_a_refused_record_is_not_sent_again(tmp_path, monkeypatch, live_board):
    with clone(monkeypatch, tmp_path, "eve", live_board.url) as queue:
        assert post.send([{"user": "eve", "kind": "checkpoint", "checkpoint": "x", "time": "yesterday", "run": "r"}]) is False
        assert not queue.exists(), "the board said why it refused it: sending it again would not help"
        monkeypatch.setattr(post, "_take", lambda q: 1 / 0)
        assert post.send([]) is False
    with pytest.raises(ValueError, match="ch07-sweep"):
        checkpoint("ch07 sweep!")
    monkeypatch.delenv(post.URL_SETTING, raising=False)
    monkeypatch.setenv(settings.SETTINGS_ENV_VAR, str(tmp_path / "no-settings.mk"))
    assert post.send([{"user": "x"}]) is False  # no board configured: nothing sent, nothing queued


def test_checkpoints_are_listed_per_attendee_and_are_no_part_of_any_check(tmp_path):
    folder = tmp_path / "records"
    (folder / "ana").mkdir(parents=True)
    lines = [{"user": "ana", "kind": "checkpoint", "checkpoint": "ch07-sweep", "time": "2026-11-28T10:31:02+00:00", "run": "a1"},
             {"user": "ana", "kind": "checkpoint", "checkpoint": "ch07-sweep", "time": "2026-11-28T10:35:00+00:00", "run": "a2"},
             {"user": "ana", "notebook": "05_shard_split", "check": "shard_split", "part": "pure", "status": "passed",
              "seconds": 0.1, "time": "2026-11-28T10:32:00+00:00", "run": "a3"}]
    (folder / "ana" / "ana.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    data = board.board_data(folder, roster=["ana", "dan"])
    assert data["checkpoints"] == ["ch07-sweep"]
    assert data["attendees"] == [{"user": "ana", "reached": {"ch07-sweep": "2026-11-28T10:31:02+00:00"}},
                                 {"user": "dan", "reached": {}}]  # the first time it was reached; dan reached none
    assert "ch07-sweep" not in {p["part"] for p in data["parts"]}
    page = board.render(data)
    assert "<tr data-user='dan'><td>dan</td><td></td><td class='n'>0 of 1</td></tr>" in page


def test_make_board_prints_the_token_and_the_line_attendees_configure_with(tmp_path):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "packlab.course.hub.board", "--records", str(tmp_path),
                                "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        lines = [process.stdout.readline() for _ in range(3)]
        token = lines[1].split("class token: ")[1].strip()
        assert board.TOKEN_PATTERN.fullmatch(token)
        assert f"PACKLAB_CLASS_URL=http://127.0.0.1:{port} PACKLAB_CLASS_TOKEN={token}" in lines[2]
        record = {"user": "ana", "kind": "checkpoint", "checkpoint": "ch01", "time": "2026-11-28T10:31:02+00:00", "run": "r1"}
        assert fetch(f"http://127.0.0.1:{port}/records", token=token, data=json.dumps(record).encode())[0] == 200
        assert fetch(f"http://127.0.0.1:{port}/", token=None)[0] == 200  # on loopback the page needs no token
    finally:
        process.terminate()
        process.wait(30)
    assert (tmp_path / "ana" / "ana.jsonl").exists()


@pytest.mark.needs_book
def test_the_board_in_chromium_with_the_token_shows_the_three_attendees(live_board, chromium, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    for user, reached in (("ana", ["ch05-split", "ch07-sweep"]), ("ben", ["ch05-split"]), ("chen", [])):
        batch = [{"user": user, "kind": "checkpoint", "checkpoint": name, "time": f"2026-11-28T10:3{i}:00+00:00",
                  "run": f"{user}-{i}"} for i, name in enumerate(reached)]
        batch.append({"user": user, "notebook": "05_shard_split", "check": "shard_split", "part": "pure",
                      "status": "passed" if reached else "failed", "seconds": 0.1, "time": "2026-11-28T10:40:00+00:00",
                      "run": f"{user}-run"})
        assert post.post(live_board.url, TOKEN, batch, timeout=10) == 200
    screens = tmp_path / "screens"
    screens.mkdir()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.goto(live_board.url + "/")
            assert "class token" in page.content()  # refused without it, and told how
            page.goto(f"{live_board.url}/?token={TOKEN}")
            page.wait_for_selector("#checkpoints tr[data-user='chen']", timeout=30_000)
            assert "token=" not in page.url
            rows = page.locator("#checkpoints tr[data-user]")
            assert rows.evaluate_all("rs => rs.map(r => r.dataset.user)") == ["ana", "ben", "chen"]
            assert page.locator("#checkpoints tr[data-user='ana'] td.n").inner_text() == "2 of 2"
            page.reload()  # the cookie keeps the viewer in
            page.wait_for_selector("#checkpoints tr[data-user='ben']", timeout=30_000)
            page.screenshot(path=str(screens / "class-board.png"), full_page=True)
        finally:
            browser.close()
