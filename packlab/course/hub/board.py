"""The live progress board: where the room is, part by part, and who is stuck longest.

Every ``check()`` an attendee runs appends its parts' results to the class folder
(:mod:`packlab.course.grading.records`). The board reads that folder and shows, for every
part of every exercise anyone has started:

* how many attendees **passed** it (their latest run of it passed), **failed** it (their
  latest run failed), or have **not started** it (no run yet, or their code still raises
  the stub's ``NotImplementedError``);
* **who is stuck longest**: attendees whose latest run of a part failed, ordered by how
  long ago it first failed without passing since, with the number of runs meanwhile.

It is a page that refreshes itself every :data:`REFRESH_SECONDS`, and ``data.json`` beside
it for scripts. Two ways to serve it:

* ``make board`` (``python -m packlab.course.hub.board --records DIR``): on 127.0.0.1 only,
  without a login, for an instructor's own machine (a shared class folder on a cluster);
* on the hub, as a JupyterHub service at ``/services/board/`` (``--hub``): the hub logs the
  viewer in, and only its admins (the instructors) may see it.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from packlab.course.grading import records

#: Seconds between two refreshes of the page.
REFRESH_SECONDS = 2
#: How many stuck attendees the page lists.
STUCK_SHOWN = 10
#: Okabe-Ito colours: passed, failed, not started (readable with any colour vision).
COLOURS = {"passed": "#0072B2", "failed": "#D55E00", "not started": "#999999"}


@dataclass
class PartRow:
    """One part of one check: who passed it, who failed it, who has not started it."""

    notebook: str
    check: str
    part: str
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)


@dataclass
class Stuck:
    """An attendee whose latest run of a part failed: since when, and after how many runs."""

    user: str
    notebook: str
    check: str
    part: str
    since: datetime
    runs: int

    def minutes(self, now: datetime) -> float:
        return (now - self.since).total_seconds() / 60


def _registered_parts() -> dict[str, list[tuple[str, str]]]:
    """``{notebook: [(check, part), ...]}`` of every registered check, in order."""
    from packlab.course.grading import list_checks

    out: dict[str, list[tuple[str, str]]] = {}
    for info in list_checks():
        out.setdefault(info.notebook, []).extend((info.id, part) for part in info.parts)
    return out


def summarise(entries: list[dict], roster: list[str] | None = None) -> tuple[list[PartRow], list[Stuck]]:
    """The board's rows and its stuck list from the records (oldest first, as :func:`records.read_records` gives them).

    ``roster`` is the class list: everyone on it who has no run of a part counts as not
    started there. Without one, the users seen in the records are the class.
    """
    users = list(roster) if roster else list(dict.fromkeys(e["user"] for e in entries))
    latest: dict[tuple, dict] = {}
    history: dict[tuple, list[dict]] = {}
    for entry in entries:
        key = (entry["user"], entry["notebook"], entry["check"], entry["part"])
        latest[key] = entry
        history.setdefault(key, []).append(entry)
    registered = _registered_parts()
    notebooks = sorted({e["notebook"] for e in entries})
    rows = []
    for notebook in notebooks:
        parts = registered.get(notebook) or list(dict.fromkeys((e["check"], e["part"]) for e in entries if e["notebook"] == notebook))
        for check, part in parts:
            row = PartRow(notebook, check, part)
            for user in sorted(set(users) | {e["user"] for e in entries if e["notebook"] == notebook}):
                entry = latest.get((user, notebook, check, part))
                status = entry["status"] if entry else "not started"
                {"passed": row.passed, "failed": row.failed}.get(status, row.not_started).append(user)
            rows.append(row)
    stuck = []
    for key, entry in latest.items():
        if entry["status"] != "failed":
            continue
        runs = history[key]
        last_pass = max((i for i, e in enumerate(runs) if e["status"] == "passed"), default=-1)
        failing = runs[last_pass + 1:]
        stuck.append(Stuck(*key, since=failing[0]["when"], runs=len(failing)))
    stuck.sort(key=lambda s: s.since)
    return rows, stuck


def read_roster(path: str | os.PathLike | None) -> list[str] | None:
    """The class list (one name a line, ``#`` comments), or None without one."""
    if not path or not Path(path).is_file():
        return None
    from packlab.course.hub.accounts import read_class_list

    return read_class_list(Path(path))


def board_data(folder: Path, roster: list[str] | None = None, now: datetime | None = None) -> dict:
    """The board as plain data (what ``data.json`` serves)."""
    now = now or datetime.now(timezone.utc)
    rows, stuck = summarise(records.read_records(folder), roster)
    return {
        "updated": now.isoformat(timespec="seconds"),
        "parts": [{"notebook": r.notebook, "check": r.check, "part": r.part, "passed": r.passed, "failed": r.failed,
                   "not_started": r.not_started} for r in rows],
        "stuck": [{"user": s.user, "notebook": s.notebook, "check": s.check, "part": s.part,
                   "since": s.since.isoformat(timespec="seconds"), "minutes": round(s.minutes(now), 1), "runs": s.runs}
                  for s in stuck[:STUCK_SHOWN]],
    }


def _bar(row: dict) -> str:
    total = len(row["passed"]) + len(row["failed"]) + len(row["not_started"]) or 1
    cells = []
    for status, names in (("passed", row["passed"]), ("failed", row["failed"]), ("not started", row["not_started"])):
        if names:
            width = 100 * len(names) / total
            cells.append(f'<span class="seg" style="width:{width:.1f}%;background:{COLOURS[status]}" '
                         f'title="{status}: {html.escape(", ".join(names))}"></span>')
    return f'<span class="bar">{"".join(cells)}</span>'


def render(data: dict) -> str:
    """The board's HTML page (it reloads itself every :data:`REFRESH_SECONDS`)."""
    esc = html.escape
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<meta http-equiv='refresh' content='{REFRESH_SECONDS}'><title>Class board</title>",
        "<style>body{font:16px system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{padding:.25em .7em;text-align:left;border-bottom:1px solid #ddd}td.n{text-align:right;font-variant-numeric:tabular-nums}"
        ".bar{display:inline-flex;width:12em;height:1em;background:#eee}.seg{display:inline-block;height:100%}"
        f".passed{{color:{COLOURS['passed']}}}.failed{{color:{COLOURS['failed']}}}</style></head><body>",
        f"<h1>Class board</h1><p>Updated {esc(data['updated'])}; every check run in the room, latest run per attendee and part.</p>",
        "<h2>Stuck longest</h2>",
    ]
    if data["stuck"]:
        out.append("<table id='stuck'><tr><th>attendee</th><th>exercise</th><th>part</th><th>failing for</th><th>runs</th></tr>")
        for s in data["stuck"]:
            out.append(f"<tr><td>{esc(s['user'])}</td><td>{esc(s['notebook'])}</td><td>{esc(s['check'])} / {esc(s['part'])}</td>"
                       f"<td class='n'>{s['minutes']:.0f} min</td><td class='n'>{s['runs']}</td></tr>")
        out.append("</table>")
    else:
        out.append("<p id='stuck'>Nobody: no part's latest run failed.</p>")
    notebook = None
    for row in data["parts"]:
        if row["notebook"] != notebook:
            if notebook is not None:
                out.append("</table>")
            notebook = row["notebook"]
            out.append(f"<h2>{esc(notebook)}</h2><table class='exercise' data-notebook='{esc(notebook)}'>"
                       "<tr><th>check / part</th><th class='passed'>passed</th><th class='failed'>failed</th>"
                       "<th>not started</th><th></th></tr>")
        out.append(f"<tr data-part='{esc(row['check'])}/{esc(row['part'])}'><td>{esc(row['check'])} / {esc(row['part'])}</td>"
                   f"<td class='n passed'>{len(row['passed'])}</td><td class='n failed'>{len(row['failed'])}</td>"
                   f"<td class='n'>{len(row['not_started'])}</td><td>{_bar(row)}</td></tr>")
    if notebook is not None:
        out.append("</table>")
    else:
        out.append("<p>No check has run yet.</p>")
    out.append("</body></html>")
    return "\n".join(out)


def make_app(folder: Path, roster_path: Path | None, prefix: str = "/", hub: bool = False):
    """The board's tornado application: the page at ``prefix``, ``prefix + 'data.json'``; with ``hub``, a hub login."""
    from tornado import web

    mixins: tuple = ()
    routes = []
    if hub:
        from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated

        mixins = (HubOAuthenticated,)
        routes.append((prefix + "oauth_callback", HubOAuthCallbackHandler))

    def current() -> dict:
        return board_data(folder, read_roster(roster_path))

    class Page(*mixins, web.RequestHandler):
        @web.authenticated if hub else (lambda f: f)
        def get(self):
            self.set_header("Cache-Control", "no-store")
            self.write(render(current()))

    class Data(*mixins, web.RequestHandler):
        @web.authenticated if hub else (lambda f: f)
        def get(self):
            self.set_header("Cache-Control", "no-store")
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(current()))

    routes += [(prefix, Page), (prefix + "data.json", Data)]
    return web.Application(routes, cookie_secret=os.urandom(32))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.hub.board", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="the class folder the checks record into")
    parser.add_argument("--roster", type=Path, default=None, help="the class list (one name a line): who has not started")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--hub", action="store_true", help="run as the hub's service (its login, at its service prefix)")
    args = parser.parse_args(argv)
    from tornado import ioloop

    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/") if args.hub else "/"
    app = make_app(args.records, args.roster, prefix, args.hub)
    app.listen(args.port, address="127.0.0.1")
    print(f"class board of {args.records} on http://127.0.0.1:{args.port}{prefix} (Ctrl+C stops it)", flush=True)
    ioloop.IOLoop.current().start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
