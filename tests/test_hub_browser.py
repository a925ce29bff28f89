"""The class hub (``make hub``), driven in a real browser: three attendees, an instructor, the board.

A real JupyterHub (JupyterHub from PyPI, configurable-http-proxy from npm) is prepared and
started the way ``make hub`` does it (:mod:`packlab.course.hub.cli`), for a class list of
three attendees and an instructor, on a release of this working tree, with a small dataset.
In headless Chromium (Playwright):

* ana, ben and chen log in with their own passwords; each one's JupyterLab starts, in a
  sandbox, in their own clone of the release, on ``mywork/exercises`` (made at the start);
* each opens ``mywork/exercises/05_shard_split.md`` from their ``mywork/`` and runs the
  ``shard_split`` check: ana with a correct ``shards_for``, ben with one that never raises
  for too few shards, chen on the untouched stub;
* the instructor opens the board at ``/services/board/``: within seconds of the last check
  it shows each part's passed / failed / not started counts (too_few_shards: 1 / 1 / 1)
  and ben as stuck; an attendee is refused the board;
* the instructor commits a fix to the release; ana's ``make update`` (``git pull``) in her
  notebook brings it in, her own work in ``mywork/`` stays as she saved it, and her
  ``make submit`` hands it in to the hub's drop folder.

Screenshots: ``_build/screens/hub-*.png``. It runs in ``make test``'s browser phase
(``needs_book``), beside the unit tests.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from browser_support import CHROMIUM_FLAGS, chromium, unavailable  # noqa: F401 - the shared fixture

from packlab import paths
from packlab.course import release, sandbox
from packlab.course.hub import cli, config

pytestmark = pytest.mark.needs_book

SCREENS = paths.build_dir() / "screens"
EXERCISE = "mywork/exercises/05_shard_split.md"
START_TIMEOUT = 120  # seconds for the hub to answer
UI_TIMEOUT = 180_000  # milliseconds: a server's first start clones the release and starts JupyterLab
BOARD_WITHIN = 20  # seconds from the last check to the board showing it (it refreshes every 2 s)
SOLVED = '''def shards_for(shards, rank, world_size, worker_id, num_workers):
    if len(shards) < world_size * num_workers:
        raise ValueError(f"{len(shards)} shards for {world_size * num_workers} readers")
    return list(shards[rank::world_size][worker_id::num_workers])
'''
NEVER_RAISES = '''def shards_for(shards, rank, world_size, worker_id, num_workers):
    return list(shards[rank::world_size][worker_id::num_workers])
'''
ATTENDEES = {"ana": SOLVED, "ben": NEVER_RAISES, "chen": None}


def _git(cwd: Path, *args: str) -> str:
    identity = ["-c", "user.name=instructor", "-c", "user.email=instructor@example.invalid"]
    return subprocess.run(["git", *identity, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A running hub: yields (base URL, hub folder, passwords, release repository)."""
    if not config.PROXY.exists():
        unavailable(f"configurable-http-proxy is not installed at {config.PROXY}: `make hub-proxy` installs it (make test does)")
    if why := sandbox.why_unavailable():
        unavailable(f"no sandbox for the attendees' servers: {why}")
    folder = tmp_path_factory.mktemp("hub") / "hub"
    upstream = tmp_path_factory.mktemp("release") / "course"
    assert release.release(upstream) is not None
    class_list = folder.parent / "class.txt"
    class_list.write_text("# a test class\nana\nben\nchen\nlee instructor\n")
    port = config.free_port()
    # Three attendees on this 2-core machine are past the slices it has (one of 2 cores): oversubscribed on purpose,
    # which also runs the shared-slice path for real.
    config_file = cli.prepare(class_list, folder, url=f"http://127.0.0.1:{port}", release_repo=upstream, count=500,
                              log=lambda line: None, oversubscribe=True)
    passwords = dict(line.split()[:2] for line in (folder / "passwords.txt").read_text().splitlines() if not line.startswith("#"))
    log_path = folder / "jupyterhub.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config_file)], cwd=folder, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                with urllib.request.urlopen(f"{base}/hub/api/", timeout=5) as reply:
                    if reply.status == 200:
                        break
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterHub did not start:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield base, folder, passwords, upstream
    finally:
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 20)):
            if server.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=wait)


@pytest.fixture(scope="module")
def browser(chromium):  # noqa: F811 - chromium is the imported fixture
    from playwright.sync_api import sync_playwright

    for old in SCREENS.glob("hub-*.png"):
        old.unlink()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def _screenshot(page, name: str) -> None:
    SCREENS.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(Exception):
        page.screenshot(path=str(SCREENS / f"hub-{name}.png"), full_page=True)


def _log_in(browser, base: str, name: str, password: str):
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.set_default_timeout(UI_TIMEOUT)
    page.goto(f"{base}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")
    return page


def _run_cell(page, cell) -> None:
    cell.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Shift+Enter")


def _replace_cell(page, cell, code: str) -> None:
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(code)
    page.keyboard.press("Escape")


def _open_exercise(page, base: str, name: str):
    page.wait_for_url(re.compile(rf".*/user/{name}/lab.*"))
    page.goto(f"{base}/user/{name}/lab/tree/{EXERCISE}")
    panel = page.locator(".jp-NotebookPanel:visible")
    panel.locator(".jp-Notebook .jp-Cell").first.wait_for()
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle$")).wait_for()
    assert page.locator(".jp-FileEditor:visible").count() == 0, "the exercise opened as text, not as a notebook"
    return panel


def _board_row(page, part: str) -> tuple[int, int, int] | None:
    row = page.locator(f"tr[data-part='shard_split/{part}']")
    if row.count() == 0:
        return None
    return tuple(int(n) for n in row.locator("td.n").all_text_contents())


def test_three_attendees_run_checks_and_the_instructor_sees_them_on_the_board(hub, browser):
    base, folder, passwords, upstream = hub
    pages = {name: _log_in(browser, base, name, passwords[name]) for name in ATTENDEES}  # their servers start side by side
    finished = {}
    for name, code in ATTENDEES.items():
        page = pages[name]
        try:
            panel = _open_exercise(page, base, name)
            cells = panel.locator(".jp-CodeCell")
            _run_cell(page, cells.nth(0))
            stub = cells.filter(has_text="def shards_for").first
            if code is not None:
                _replace_cell(page, stub, code)
            _run_cell(page, stub)
            check_cell = cells.filter(has_text='check("shard_split"').first
            _run_cell(page, check_cell)
            report = check_cell.locator(".jp-OutputArea")
            report.get_by_text("parts passed").first.wait_for()
            finished[name] = time.monotonic()
            _screenshot(page, f"{name}-check")
        except BaseException:
            _screenshot(page, f"{name}-failed")
            raise
    assert (folder / "users" / "ana" / "course" / "mywork" / "exercises" / "05_shard_split.md").is_file()

    instructor = _log_in(browser, base, "lee", passwords["lee"])
    try:
        instructor.wait_for_url(re.compile(r".*/(user|hub)/.*"))
        instructor.goto(f"{base}/services/board/")
        deadline = finished["chen"] + BOARD_WITHIN
        while _board_row(instructor, "too_few_shards") != (1, 1, 1):
            assert time.monotonic() < deadline, f"the board did not show the three results within {BOARD_WITHIN} s"
            time.sleep(0.5)
            with contextlib.suppress(Exception):
                instructor.reload()
        shown_after = time.monotonic() - finished["chen"]
        assert _board_row(instructor, "exactly_once") == (2, 0, 1)
        stuck = instructor.locator("#stuck").text_content()
        assert "ben" in stuck and "too_few_shards" in stuck and "ana" not in stuck
        _screenshot(instructor, "board")
    except BaseException:
        _screenshot(instructor, "board-failed")
        raise
    refused = pages["ana"].goto(f"{base}/services/board/")
    assert refused.status == 403, "an attendee must not see the board"
    print(f"the board showed the three results {shown_after:.1f} s after the last check")

    # A new release: the instructor fixes the chapter and the exercise; ana brings it in from her notebook.
    fix = "\n<!-- a fix on day 2 -->\n"
    for name in ("chapters/05_tar_shards.md", "exercises/05_shard_split.md"):
        (upstream / name).write_text((upstream / name).read_text() + fix)
    _git(upstream, "commit", "-qam", "day 2: a fix")
    page = pages["ana"]
    mine = (folder / "users" / "ana" / "course" / EXERCISE).read_text()
    page.goto(f"{base}/user/ana/lab/tree/{EXERCISE}")
    panel = page.locator(".jp-NotebookPanel:visible")
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle$")).wait_for()
    last = panel.locator(".jp-CodeCell").last
    last.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("b")  # a new cell below, as an attendee would add one
    page.keyboard.press("Enter")
    page.keyboard.insert_text("!make -C ~/course update && make -s -C ~/course submit")
    page.keyboard.press("Shift+Enter")
    output = panel.locator(".jp-OutputArea", has_text="Fast-forward")
    try:
        output.first.wait_for(timeout=60_000)
    except BaseException:
        _screenshot(page, "update-failed")
        raise
    course = folder / "users" / "ana" / "course"
    assert (course / "chapters" / "05_tar_shards.md").read_text().endswith(fix), "the release did not arrive"
    assert (course / EXERCISE).read_text().split("```{code-cell}")[:4] == mine.split("```{code-cell}")[:4], \
        "ana's work in mywork/ must stay"
    assert _git(course, "status", "--porcelain") == "", "git sees changes: a later pull could be blocked"
    panel.locator(".jp-OutputArea", has_text="handed in").first.wait_for(timeout=60_000)
    handed = folder / "dropbox" / "ana" / "exercises" / "05_shard_split.md"
    assert handed.read_text() == (course / EXERCISE).read_text(), "make submit did not hand in to the drop folder"
