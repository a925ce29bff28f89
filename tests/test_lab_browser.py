"""The attendee's path: the course's JupyterLab (``make lab``), driven in a real browser, in a clone.

Attendees clone the course (a release, ``make release``), run ``make lab``, open a
chapter or their copy of an exercise (MyST ``.md`` files) as a notebook, run it, solve
the exercises with ``check()``, and on day 2 ``git pull`` a fix. This test does the same
in headless Chromium, driven by Playwright, in a temporary clone (never in this checkout):

* the release of this working tree is made into a temporary git repository (the
  instructor's), and cloned (the attendee's);
* JupyterLab starts with ``make lab``'s command line and settings (:mod:`packlab.course.lab`)
  on the clone, on a free port, with a token and fresh workspaces and user settings, so
  that nothing of an earlier session is restored; starting it copies the exercises into
  the clone's ``mywork/exercises/`` (git-ignored);
* ``mywork/exercises/01_jpeg_dataset.md``, opened by its ``/lab/tree/`` URL, is a notebook,
  not a text editor. Its first cell lists the checks; the reference ``JpegFolderDataset``
  from ``solutions/`` goes into the stub's cell, and the check reports every part
  passed. Saving writes that cell into the ``.md`` file, and nothing else;
* ``chapters/03_zip_pitfall.md``, double-clicked in the file browser, runs from top to
  bottom ("Run All Cells") without an error; every ``{eval}`name``` in its prose shows
  the value the chapter's cells passed to ``figures()`` (no raw role, no bare name);
  saving leaves the ``.md`` file byte-identical (its header is as jupytext writes it),
  while the paired ``.ipynb`` keeps the evaluated values;
* a "Try it" done as the chapters say, in the chapter's console (right-click → *New
  Console for Notebook*), sees the chapter's names, and saving the chapter afterwards
  leaves it byte-identical: no tracked file changes;
* then the instructor commits a fix to that chapter and to that exercise, and ``make
  update`` in the clone succeeds with nothing to put aside: it names the chapter and
  the exercise it changed, the fix arrives, and the attendee's solution in ``mywork/`` stays.

Screenshots: ``_build/screens/lab-*.png``. Under ``make test`` it runs after the
notebooks (``needs_book`` orders it there, see ``packlab/course/testrun.py``), beside the
unit tests: chapter 2 has written the archives chapter 3 reads.
Chromium: see ``browser_support.py``.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from browser_support import CHROMIUM_FLAGS, chromium  # noqa: F401 - the shared fixture

from packlab import paths
from packlab.course import exercises, lab, release, update

pytestmark = pytest.mark.needs_book

ROOT = paths.repo_root()
SCREENS = paths.build_dir() / "screens"
EXERCISE = "mywork/exercises/01_jpeg_dataset.md"  # the attendee's copy, made by make lab
SOLUTION = "solutions/01_jpeg_dataset.md"
CHAPTER = "chapters/03_zip_pitfall.md"
START_TIMEOUT = 180  # seconds for JupyterLab to answer
UI_TIMEOUT = 120_000  # milliseconds for the page to show something (kernel start included)
CHECK_TIMEOUT = 600_000  # milliseconds for the exercise's check
RUN_ALL_TIMEOUT = 1_500_000  # milliseconds for the whole chapter (make test allows 600 s per cell)
PROSE_SETTLE_TIMEOUT = 120  # seconds for the markdown cells to show their evaluated values after the last prompt
CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
EVAL = re.compile(r"\{eval\}`([^`]*)`")


# ---------------------------------------------------------------------------------------
# JupyterLab and the browser


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _request(url: str, token: str, method: str = "GET"):
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status


def _stop(server: subprocess.Popen, base: str, token: str) -> None:
    """Shut JupyterLab down through its API (which stops the kernels, in sessions of their own), else kill it."""
    with contextlib.suppress(Exception):
        _request(f"{base}/api/shutdown", token, method="POST")
        server.wait(timeout=60)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if server.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=20)


def _git(cwd: Path, *args: str) -> str:
    identity = ["-c", "user.name=instructor", "-c", "user.email=instructor@example.invalid"]
    return subprocess.run(["git", *identity, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """(the instructor's release repository, the attendee's clone of it)."""
    upstream = tmp_path_factory.mktemp("release") / "course"
    assert release.release(upstream) is not None
    attendee = tmp_path_factory.mktemp("attendee") / "course"
    subprocess.run(["git", "clone", "-q", str(upstream), str(attendee)], check=True)
    return upstream, attendee


@pytest.fixture(scope="module")
def jupyterlab(clone, tmp_path_factory):
    """``make lab``'s JupyterLab on the clone, on a free port, with fresh state; yields (base URL, token)."""
    _, attendee = clone
    state = tmp_path_factory.mktemp("lab-state")
    port, token = _free_port(), secrets.token_hex(16)
    made = lab.prepare(state, root=attendee)
    assert EXERCISE.split("/")[-1] in [p.name for p in made], "make lab did not copy the exercises into mywork/"
    cmd = lab.command(port=port, state_dir=state, token=token, open_browser=False, port_retries=0, root=attendee)
    log_path = state / "jupyterlab.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, cwd=attendee, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if _request(f"{base}/api/status", token) == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start ({' '.join(cmd)}):\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, token
    finally:
        _stop(server, base, token)


@pytest.fixture(scope="module")
def page(chromium, jupyterlab):  # noqa: F811 - chromium is the imported fixture
    from playwright.sync_api import sync_playwright

    for old in SCREENS.glob("lab-*.png"):  # a screenshot of an earlier failure would mislead
        old.unlink()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 900})
            tab.set_default_timeout(UI_TIMEOUT)
            yield tab
        finally:
            browser.close()


def _screenshot(page, name: str) -> None:
    SCREENS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENS / f"lab-{name}.png"))


def _current_notebook(page, title: str):
    """The notebook in the current tab, once the tab called ``title`` is current; fails on a text editor."""
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-current", has_text=title).wait_for()
    page.locator(".jp-NotebookPanel:visible, .jp-FileEditor:visible").first.wait_for()
    editors = page.locator(".jp-FileEditor:visible").count()
    assert editors == 0, f"{title} opened in the text editor, not as a notebook"
    panel = page.locator(".jp-NotebookPanel:visible")
    assert panel.count() == 1
    panel.locator(".jp-Notebook .jp-Cell").first.wait_for()  # the cells are loaded
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle$")).wait_for()  # the kernel has started
    return panel


@contextlib.contextmanager
def _screenshot_on_failure(page, name: str):
    """Keep what the page showed when a step failed: ``_build/screens/lab-<name>-failed.png``."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            _screenshot(page, f"{name}-failed")
        raise


def _run_cell(page, cell) -> None:
    cell.locator(".jp-InputPrompt").first.click()  # selects the cell, in command mode
    page.keyboard.press("Shift+Enter")


def _save_and_wait(page, path: Path) -> None:
    """Save the current notebook (Ctrl+S) and wait until jupytext has written ``path``."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 60
    while not (path.exists() and path.stat().st_mtime_ns != before):
        assert time.monotonic() < deadline, f"saving in JupyterLab did not write {path}"
        time.sleep(0.2)
    time.sleep(1)  # the paired file is written in the same save


def _diff(expected: str, actual: str, name: str) -> str:
    return "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), "expected", name))


# ---------------------------------------------------------------------------------------
# The exercise


def _reference_solution(cell_marker: str) -> str:
    """The code cell of the solution notebook that contains ``cell_marker``, without the solution markers."""
    text = (ROOT / SOLUTION).read_text()
    cell = next(body for body in CODE_CELL.findall(text) if cell_marker in body)
    markers = {exercises.BEGIN_SOLUTION, exercises.END_SOLUTION}
    return "\n".join(line for line in cell.splitlines() if line.strip() not in markers)


def test_an_exercise_opens_as_a_notebook_and_a_correct_solution_passes_its_check(page, jupyterlab, clone):
    base, token = jupyterlab
    with _screenshot_on_failure(page, "exercise"):
        exercise_path = clone[1] / EXERCISE
        original = exercise_path.read_text()
        page.goto(f"{base}/lab/tree/{EXERCISE}?token={token}")
        panel = _current_notebook(page, exercise_path.name)
        _screenshot(page, "exercise-open")

        code_cells = panel.locator(".jp-CodeCell")
        listing = code_cells.nth(0)
        _run_cell(page, listing)
        listing.locator(".jp-OutputArea").get_by_text("JpegFolderDataset(keys=None", exact=False).first.wait_for()

        solution = _reference_solution("class JpegFolderDataset")
        stub = code_cells.filter(has_text="class JpegFolderDataset").first
        assert "NotImplementedError" in stub.text_content(), "the exercise's stub cell is not where the test expects it"
        stub.locator(".cm-content").click()
        page.keyboard.press("Control+a")
        page.keyboard.insert_text(solution)  # as pasted: no auto-indent, no closing brackets added
        page.keyboard.press("Escape")
        _run_cell(page, stub)
        one_item = code_cells.filter(has_text="JpegFolderDataset(return_key=True)[0]").first
        _run_cell(page, one_item)
        one_item.locator(".jp-OutputArea").get_by_text("torch.float32").wait_for()
        check_cell = code_cells.filter(has_text='check("jpeg_dataset"').first
        _run_cell(page, check_cell)
        report = check_cell.locator(".jp-OutputArea")
        report.get_by_text("All parts passed").or_(report.get_by_text("Fix the parts marked")).first.wait_for(
            timeout=CHECK_TIMEOUT
        )
        check_cell.scroll_into_view_if_needed()
        _screenshot(page, "exercise-check")
        outcome = report.text_content()
        assert "All parts passed" in outcome, f"the reference solution failed its check:\n{outcome}"

        _save_and_wait(page, exercise_path)
        stub_source = next(body for body in CODE_CELL.findall(original) if "class JpegFolderDataset" in body)
        expected = original.replace(stub_source, solution.rstrip("\n") + "\n", 1)
        saved = exercise_path.read_text()
        assert saved == expected, "saving wrote other changes than the edited cell:\n" + _diff(expected, saved, EXERCISE)


# ---------------------------------------------------------------------------------------
# The chapter

_CELLS_AS_SHOWN = """(panel) => [...panel.querySelectorAll('.jp-Cell')].map(cell => {
    // A cell whose input is hidden (jupyter.source_hidden) shows a placeholder instead of its input area.
    const shown = (cell.querySelector('.jp-InputArea') || document.createElement('div')).cloneNode(true);
    shown.querySelectorAll('.jp-Editor, .jp-InputPrompt').forEach(node => node.remove());
    return {
        markdown: cell.classList.contains('jp-MarkdownCell'),
        prompt: (cell.querySelector('.jp-InputPrompt') || {}).textContent || '',
        text: shown.textContent,
        code: [...shown.querySelectorAll('code')].map(node => node.textContent),
    };
})"""


def _glued_values(notebook: dict) -> dict[str, str]:
    """What the chapter's cells passed to ``figures()``, as text, by name (from the saved .ipynb)."""
    values = {}
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            text = output.get("data", {}).get("application/papermill.record/text/plain")
            if name and text is not None:
                values[name] = re.sub(r"^([\"'])(.*)\1$", r"\2", text)  # a string shows without its quotes
    return values


def _prose_problems(cells: list[dict], notebook: dict, glued: dict[str, str]) -> list[str]:
    """What the page's markdown cells get wrong about the values the chapter glued: a raw role, a bare name, a value
    not shown, an expression jupyterlab-myst did not evaluate (from the saved notebook's metadata)."""
    if len(cells) != len(notebook["cells"]):
        return [f"the page shows {len(cells)} cells, the saved notebook has {len(notebook['cells'])}"]
    problems = []
    for number, (shown, stored) in enumerate(zip(cells, notebook["cells"])):
        if not shown["markdown"]:
            continue
        names = EVAL.findall("".join(stored["source"]))
        for raw in ("{eval", "{glue"):
            if raw in shown["text"]:
                problems.append(f"markdown cell {number} shows a raw {raw}...}} role")
        expressions = stored["metadata"].get("user_expressions", [])
        evaluated = {e["expression"]: e["result"].get("status") for e in expressions}
        for name in names:
            if name not in glued:
                problems.append(f"markdown cell {number}: no cell passed {name}= to figures()")
            elif name in shown["code"]:
                problems.append(f"markdown cell {number} shows the bare name {name!r}, not its value")
            elif glued[name] not in shown["text"]:
                problems.append(f"markdown cell {number} does not show {name} = {glued[name]!r}")
            if evaluated.get(name) != "ok":
                problems.append(f"markdown cell {number}: jupyterlab-myst did not evaluate {name}: {evaluated.get(name)}")
    return problems


def test_a_chapter_runs_in_jupyterlab_and_its_prose_shows_the_measured_numbers(page, jupyterlab, clone):
    base, token = jupyterlab
    with _screenshot_on_failure(page, "chapter"):
        chapter_path = clone[1] / CHAPTER
        paired_path = chapter_path.with_suffix(".ipynb")
        original = chapter_path.read_text()
        # As an attendee does: in the file browser, a double-click on the folder, one on the chapter.
        # (A workspace of its own: nothing restored from the other test moves the file browser meanwhile.)
        page.goto(f"{base}/lab/workspaces/chapter?token={token}")
        for name in ("chapters", chapter_path.name):
            page.locator(".jp-DirListing-itemText", has_text=re.compile(rf"^\s*{re.escape(name)}\s*$")).dblclick()
        panel = _current_notebook(page, chapter_path.name)

        started = time.monotonic()
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        panel.locator(".jp-InputPrompt", has_text="[*]").first.wait_for()
        page.wait_for_function(
            "(panel) => ![...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
            ".some(prompt => prompt.textContent.includes('*'))",
            arg=panel.element_handle(),
            timeout=RUN_ALL_TIMEOUT,
            polling=1000,
        )
        run_seconds = time.monotonic() - started
        # jupyterlab-myst evaluates a markdown cell's {eval} roles in a kernel request of its own and renders the
        # cell again when the answer arrives: on a busy machine that lags the last prompt by seconds. What is
        # checked is what the page shows once it has settled (or after PROSE_SETTLE_TIMEOUT), saved each round.
        settle_started, rounds = time.monotonic(), 0
        while True:
            rounds += 1
            cells = panel.evaluate(_CELLS_AS_SHOWN)
            _save_and_wait(page, paired_path)
            notebook = json.loads(paired_path.read_text())
            glued = _glued_values(notebook)
            problems = _prose_problems(cells, notebook, glued)
            errors = [
                f"cell {i}: {o.get('ename')}: {o.get('evalue')}"
                for i, cell in enumerate(notebook["cells"])
                for o in cell.get("outputs", [])
                if o["output_type"] == "error"
            ]
            if not problems or errors or time.monotonic() - settle_started > PROSE_SETTLE_TIMEOUT:
                break
            time.sleep(3)
        settle_seconds = time.monotonic() - settle_started
        sentence = panel.locator(".jp-MarkdownCell", has_text="of 5 runs failed").first
        sentence.scroll_into_view_if_needed()
        _screenshot(page, "chapter-eval")
        table_sentence = panel.locator(".jp-MarkdownCell", has_text="From the page cache, the locked loader reached").first
        table_sentence.scroll_into_view_if_needed()
        _screenshot(page, "chapter-table")

        # From the saved notebook, not the page: a cell whose input is hidden shows no prompt.
        not_run = [i for i, cell in enumerate(notebook["cells"])
                   if cell["cell_type"] == "code" and cell.get("execution_count") is None]
        assert not errors, f"{CHAPTER} raised in JupyterLab: {errors}"
        assert not not_run, f"Run All stopped: code cells at {not_run} did not run (after {run_seconds:.0f} s)"
        saved = chapter_path.read_text()
        assert saved == original, "saving changed the chapter's .md (run `make headers`?):\n" + _diff(original, saved, CHAPTER)
        assert len(cells) == len(notebook["cells"]), "the page and the saved notebook disagree on the cells"
        assert glued, f"{CHAPTER} glued no values: the test would check nothing"
        assert not problems, (f"after the last prompt and {settle_seconds:.0f} s ({rounds} looks) more for the markdown to render:\n"
                              + "\n".join(problems))
        print(f"{CHAPTER}: ran in JupyterLab in {run_seconds:.0f} s; {len(glued)} cited values shown "
              f"({settle_seconds:.0f} s and {rounds} look(s) after the last prompt)")


# ---------------------------------------------------------------------------------------
# A Try-it, done where the chapters say: in the chapter's console


def test_a_try_it_in_the_chapters_console_sees_the_chapter_and_leaves_it_unchanged(page, jupyterlab, clone):
    """Right-click in the chapter → New Console for Notebook: the chapter's kernel, and nothing saved into the chapter."""
    chapter_path = clone[1] / CHAPTER
    original = chapter_path.read_text()
    with _screenshot_on_failure(page, "console"):
        panel = _current_notebook(page, chapter_path.name)  # left open, run, by the chapter's test above
        panel.locator(".jp-Notebook").first.click(button="right")
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^New Console for Notebook$")).click()
        console = page.locator(".jp-CodeConsole:visible").first
        console.wait_for()
        prompt = console.locator(".jp-CodeConsole-promptCell .cm-content")
        prompt.click()
        page.keyboard.type('print(NaiveZipDataset.__name__, "seen from the console")')  # a class the chapter defined
        page.keyboard.press("Shift+Enter")
        console.locator(".jp-OutputArea-output", has_text="NaiveZipDataset seen from the console").wait_for()
        _screenshot(page, "console")
        # Back to the chapter, and save it as an attendee would: the console's cells are not in it.
        # (The console's tab carries the chapter's name too: the notebook's is the document's.)
        page.locator('.lm-DockPanel-tabBar .lm-TabBar-tab[data-type="document-title"]', has_text=chapter_path.name).click()
        _save_and_wait(page, chapter_path.with_suffix(".ipynb"))
    assert chapter_path.read_text() == original, "the Try-it changed the chapter:\n" + _diff(original, chapter_path.read_text(), CHAPTER)
    assert _git(clone[1], "status", "--porcelain", "--untracked-files=no") == "", "the Try-it left changes in tracked files"


# ---------------------------------------------------------------------------------------
# Day 2: a fix arrives


def test_after_running_a_try_it_and_saving_make_update_brings_a_fix(clone, jupyterlab):
    """The instructor fixes the chapter and the exercise the attendee ran, tried and saved; `make update` just works."""
    upstream, attendee = clone
    mine = (attendee / EXERCISE).read_text()
    assert "NotImplementedError" not in mine.split("class JpegFolderDataset", 1)[1].split("```", 1)[0], \
        "the exercise test did not save the attendee's solution first"
    assert _git(attendee, "status", "--porcelain") == "", "running and saving left changes git would see"
    fix = "\n<!-- a fix on day 2 -->\n"
    for name in (CHAPTER, "exercises/01_jpeg_dataset.md"):
        (upstream / name).write_text((upstream / name).read_text() + fix)
    _git(upstream, "commit", "-qam", "day 2: a fix to chapter 3 and exercise 1")
    said = []
    assert update.update(cwd=attendee, say=said.append) == 0, "\n".join(said)
    said = "\n".join(said)
    assert "put aside" not in said, "make update found changes to put aside: the attendee's session left some"
    assert f"The release changed: {CHAPTER}, exercises/01_jpeg_dataset.md." in said, said
    assert (attendee / CHAPTER).read_text().endswith(fix)
    assert (attendee / EXERCISE).read_text() == mine, "the attendee's own copy must stay as they saved it"
    assert _git(attendee, "status", "--porcelain", "--untracked-files=no") == ""
