"""The built book, checked the way a reader sees it: every page opened in headless Chromium.

The book is built first (warnings and broken references are errors; executed notebooks
come from the jupyter-cache, so this is quick after ``make book``). Then ``_build/html``
is served on 127.0.0.1 and each page is loaded in Chromium, driven over the DevTools
protocol. A page fails on a JavaScript exception, an image that did not load, or a
failed or 4xx/5xx request to the book's own server. Requests to other hosts are not the
book's and are ignored (this machine has no internet; a reader's browser fetches those).
Screenshots of the intro and of chapter 0 are saved under ``_build/screens/``.

Chromium comes from Debian's ``chromium`` package (see ``browser_support.py``): the test
installs it when it is missing and it may (root); otherwise it skips with a message —
except under ``CI=true``, where it must run.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import html
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import browser_support
import pytest
from browser_support import chromium  # noqa: F401 - the shared fixture

from packlab import paths

ROOT = paths.repo_root()
HTML = ROOT / "_build" / "html"
SCREENS = ROOT / "_build" / "screens"
# The shared flags; headless, since this test starts Chromium itself and drives it over
# DevTools; scrollbars hidden for clean screenshots.
CHROMIUM_FLAGS = ["--headless", *browser_support.CHROMIUM_FLAGS, "--hide-scrollbars"]
PAGE_TIMEOUT = 30  # seconds for one page to load


def _sources_newer_than(target: Path) -> list[Path]:
    stamp = target.stat().st_mtime
    candidates = [ROOT / "_config.yml", ROOT / "_toc.yml", ROOT / "intro.md"]
    for folder in ("chapters", "exercises", "packlab"):
        candidates += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".md", ".py"}]
    return [p for p in candidates if p.exists() and p.stat().st_mtime > stamp]


@pytest.fixture(scope="module")
def built_book() -> Path:
    """``_build/html``, rebuilt (strictly) unless it is newer than every source."""
    index = HTML / "index.html"
    if index.exists() and not _sources_newer_than(index):
        return HTML
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "-W", "-n", "--keep-going"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, f"the book does not build cleanly:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert index.exists()
    return HTML


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def book_url(built_book):
    handler = functools.partial(_QuietHandler, directory=str(built_book))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class DevTools:
    """A minimal Chrome DevTools Protocol client for one page target, over tornado's websocket."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future] = {}
        self.events: list[dict] = []
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, url: str) -> DevTools:
        from tornado.websocket import websocket_connect

        ws = await asyncio.wait_for(websocket_connect(url, max_message_size=256 * 1024 * 1024), 20)
        return cls(ws)

    async def _read(self):
        while True:
            message = await self.ws.read_message()
            if message is None:
                for future in self.pending.values():
                    future.cancel()
                return
            data = json.loads(message)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)

    async def call(self, method: str, timeout: float = PAGE_TIMEOUT, **params):
        self.next_id += 1
        future = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = future
        await self.ws.write_message(json.dumps({"id": self.next_id, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, timeout)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def wait_for_event(self, method: str, since: int, timeout: float = PAGE_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e.get("method") == method for e in self.events[since:]):
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no {method} within {timeout} s")

    def close(self):
        self.reader.cancel()
        self.ws.close()


@pytest.fixture(scope="module")
def browser(chromium, tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Chromium did not start (exit code {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        request = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?about:blank", method="PUT")
        with urllib.request.urlopen(request, timeout=20) as reply:
            yield json.load(reply)["webSocketDebuggerUrl"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _book_pages(html_root: Path) -> list[str]:
    skip = {"genindex.html", "search.html"}
    pages = []
    for path in sorted(html_root.rglob("*.html")):
        rel = path.relative_to(html_root).as_posix()
        if rel.startswith(("_static/", "_sources/", "_images/")) or rel in skip:
            continue
        pages.append(rel)
    return pages


async def _check_pages(ws_url: str, base: str, pages: list[str], screenshots: dict[str, Path]) -> dict[str, list[str]]:
    tools = await DevTools.connect(ws_url)
    problems: dict[str, list[str]] = {}
    try:
        for domain in ("Page", "Runtime", "Network", "Log"):
            await tools.call(f"{domain}.enable")
        await tools.call("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)
        for page in pages:
            start = len(tools.events)
            await tools.call("Page.navigate", url=base + page)
            await tools.wait_for_event("Page.loadEventFired", start)
            await asyncio.sleep(0.5)  # let late scripts run and report errors
            broken_images = await tools.call(
                "Runtime.evaluate",
                expression="Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)",
                returnByValue=True,
            )
            found = [f"image did not load: {src}" for src in broken_images["result"]["value"]]
            requests = {}
            for event in tools.events[start:]:
                method, params = event.get("method"), event.get("params", {})
                if method == "Network.requestWillBeSent":
                    requests[params["requestId"]] = params["request"]["url"]
                elif method == "Runtime.exceptionThrown":
                    details = params["exceptionDetails"]
                    text = details.get("exception", {}).get("description") or details.get("text")
                    found.append(f"JavaScript error: {text}")
                elif method == "Network.responseReceived":
                    url, status = params["response"]["url"], params["response"]["status"]
                    if url.startswith(base) and status >= 400:
                        found.append(f"HTTP {status}: {url}")
                elif method == "Network.loadingFailed":
                    url = requests.get(params["requestId"], "")
                    if url.startswith(base) and not params.get("canceled"):
                        found.append(f"request failed ({params.get('errorText')}): {url}")
            if found:
                problems[page] = found
            if page in screenshots:
                metrics = await tools.call("Page.getLayoutMetrics")
                height = min(int(metrics["cssContentSize"]["height"]), 6000)
                # A viewport as tall as the page: the page lays out as a reader would see it, with
                # the sticky sidebars in place (capturing beyond a short viewport draws them shifted).
                await tools.call("Emulation.setDeviceMetricsOverride", width=1280, height=height,
                                 deviceScaleFactor=1, mobile=False)
                await asyncio.sleep(0.5)
                shot = await tools.call("Page.captureScreenshot", format="png")
                await tools.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                                 deviceScaleFactor=1, mobile=False)
                screenshots[page].parent.mkdir(parents=True, exist_ok=True)
                screenshots[page].write_bytes(base64.b64decode(shot["data"]))
    finally:
        tools.close()
    return problems


@pytest.mark.needs_book
def test_every_page_loads_without_errors_in_a_real_browser(browser, book_url, built_book):
    pages = _book_pages(built_book)
    assert "intro.html" in pages and "chapters/00_setup.html" in pages, pages
    screenshots = {
        "intro.html": SCREENS / "intro.png",
        "chapters/00_setup.html": SCREENS / "00_setup.png",
        "chapters/07_how_fast_is_enough.html": SCREENS / "07_how_fast_is_enough.png",
    }
    for shot in screenshots.values():
        shot.unlink(missing_ok=True)
    problems = asyncio.run(_check_pages(browser, book_url, pages, screenshots))
    assert not problems, "\n".join(f"{page}:\n  " + "\n  ".join(found) for page, found in problems.items())
    for shot in screenshots.values():
        assert shot.exists() and shot.stat().st_size > 10_000, f"screenshot {shot} missing or empty"


_STDERR_BLOCK = re.compile(r'<div class="output stderr[^"]*">(.*?)</pre>', re.S)


def _stderr_blocks(page: Path) -> list[str]:
    """The text of every stderr output a page shows, markup removed."""
    return [html.unescape(re.sub(r"<[^>]+>", "", block)) for block in _STDERR_BLOCK.findall(page.read_text())]


def _noise(blocks: list[str]) -> list[str]:
    """The blocks that are not the course's own warnings: a library's or the runtime's chatter.

    A chapter may show a warning that ``packlab`` raises on purpose (chapter 10's shard
    retries); anything else printed to stderr (a library's UserWarning, Kineto's lines,
    tqdm's missing-widgets notice) is noise the reader cannot act on, and is silenced where it
    arises, with a comment saying why.
    """
    return [block.strip()[:300] for block in blocks if "/packlab/" not in block or "site-packages" in block]


def test_the_noise_rule_tells_a_library_warning_from_the_course_s_own():
    library = "/x/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found."
    own = "/x/packlab/retry.py:223: ShardRetryWarning: reading shard s3://shards/train/shard-000002.tar failed"
    in_a_clone_named_packlab = "/home/a/packlab/.venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:1: UserWarning"
    assert _noise([library, own, in_a_clone_named_packlab]) == [library, in_a_clone_named_packlab]


@pytest.mark.needs_book
def test_no_page_shows_a_library_s_warnings(built_book):
    noisy = {page: found for page in _book_pages(built_book)
             if (found := _noise(_stderr_blocks(built_book / page)))}
    assert not noisy, "stderr that is not the course's own, by page:\n" + "\n".join(
        f"{page}:\n  " + "\n  ".join(found) for page, found in noisy.items())


_IMG = re.compile(r"<img\b[^>]*>", re.I)
_ATTRIBUTE = re.compile(r'(\w[\w-]*)="([^"]*)"')
_IMAGE_FILE = re.compile(r"\.(png|jpe?g|gif|svg|webp)$", re.I)


def _content_images(page: Path) -> list[dict]:
    """The attributes of every image in a page's main content (the chapter, not the theme's navigation)."""
    text = page.read_text()
    main = text.split('id="main-content"', 1)[-1]
    return [dict(_ATTRIBUTE.findall(tag)) for tag in _IMG.findall(main)]


def _missing_alt(attributes: dict) -> bool:
    alt = html.unescape(attributes.get("alt", "")).strip()
    name = attributes.get("src", "").rsplit("/", 1)[-1]
    return not alt or alt == name or bool(_IMAGE_FILE.search(alt))


def test_an_image_without_a_sentence_for_alt_text_is_found():
    assert _missing_alt({"src": "../_images/ab12.png", "alt": "ab12.png"})
    assert _missing_alt({"src": "../_images/ab12.png", "alt": "../_images/ab12.png"})
    assert _missing_alt({"src": "../_images/ab12.png"})
    assert not _missing_alt({"src": "../_images/ab12.png", "alt": "Images per second against workers."})


@pytest.mark.needs_book
def test_every_figure_has_alt_text_that_says_what_it_shows(built_book):
    figures, missing = 0, {}
    for page in _book_pages(built_book):
        images = _content_images(built_book / page)
        figures += len(images)
        bad = [a.get("src", "?") for a in images if _missing_alt(a)]
        if bad:
            missing[page] = bad
    assert figures > 20, f"only {figures} images in the book's pages: is the main content found?"
    assert not missing, "images whose alt text is a file name or empty, by page (give the figure a caption=):\n" + \
        "\n".join(f"{page}: {', '.join(srcs)}" for page, srcs in missing.items())
