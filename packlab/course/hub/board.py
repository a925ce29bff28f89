"""The live progress board: where the room is, part by part, and who is stuck longest.

Every ``check()`` an attendee runs appends its parts' results to the class folder
(:mod:`packlab.course.grading.records`). The board reads that folder and shows, for every
part of every exercise anyone has started:

* how many attendees **passed** it (their latest run of it passed), **failed** it (their
  latest run failed), or have **not started** it (no run yet, or their code still raises
  the stub's ``NotImplementedError``);
* **who is stuck longest**: attendees whose latest run of a part failed, ordered by how
  long ago it first failed without passing since, with the number of runs meanwhile.

and, per attendee, the **checkpoints** they reached (``checkpoint("ch07-sweep")`` in a chapter).

It is a page that refreshes itself every :data:`REFRESH_SECONDS`, and ``data.json`` beside
it for scripts. Three ways to serve it:

* ``make board RECORDS=DIR`` (``python -m packlab.course.hub.board --records DIR``): on
  127.0.0.1, without a login, for an instructor's own machine (a shared class folder on a
  cluster);
* ``make board RECORDS=DIR BOARD_HOST=0.0.0.0`` in a laptop room: the attendees' checkouts
  post their records to ``/records`` (:mod:`packlab.course.hub.post`) with the class token
  (``BOARD_TOKEN``, or one made and printed at the start), and the board stores them in
  ``DIR/<user>/<user>.jsonl``, the hub's layout. Beyond loopback the page wants the token
  too: ``/?token=<token>`` once, then a cookie keeps it;
* on the hub, as a JupyterHub service at ``/services/board/`` (``--hub``): the hub logs the
  viewer in, and only its admins (the instructors) may see it.
"""

from __future__ import annotations

import argparse
import hmac
import html
import json
import os
import re
import secrets
import socket
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
#: Addresses that only this machine can reach: there the page needs no token.
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: The largest body a post may have: a batch of :data:`packlab.course.hub.post.MAX_BATCH` records is about 100 kB.
MAX_BODY = 512 * 1024
#: The most records one post may hold.
MAX_RECORDS = 1000
#: The longest string a record's field may hold.
MAX_FIELD = 200
#: The cookie that keeps a viewer's token after ``?token=``.
TOKEN_COOKIE = "packlab-board-token"
#: What a class token may be made of: it goes into settings.mk and an HTTP header as it is.
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~-]{8,128}")


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
    entries = [e for e in entries if e.get("kind") != records.CHECKPOINT]  # checkpoints are no part of a check
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


def checkpoints_reached(entries: list[dict], roster: list[str] | None = None) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The checkpoints in the order the room first reached them, and ``{user: {checkpoint: first time}}``.

    Every attendee on the roster, or seen in any record, has an entry (empty when they reached none).
    """
    names: list[str] = []
    reached: dict[str, dict[str, str]] = {user: {} for user in roster or []}
    for entry in entries:
        reached.setdefault(entry["user"], {})
        if entry.get("kind") == records.CHECKPOINT:
            if entry["checkpoint"] not in names:
                names.append(entry["checkpoint"])
            reached[entry["user"]].setdefault(entry["checkpoint"], entry["when"].isoformat(timespec="seconds"))
    return names, dict(sorted(reached.items()))


def board_data(folder: Path, roster: list[str] | None = None, now: datetime | None = None) -> dict:
    """The board as plain data (what ``data.json`` serves)."""
    now = now or datetime.now(timezone.utc)
    entries = records.read_records(folder)
    rows, stuck = summarise(entries, roster)
    checkpoints, reached = checkpoints_reached(entries, roster)
    return {
        "checkpoints": checkpoints,
        "attendees": [{"user": user, "reached": times} for user, times in reached.items()],
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


def _attendee_table(data: dict) -> list[str]:
    """Every attendee, the checkpoints each reached (a tick, the time on hover), and how many."""
    esc = html.escape
    if not data["attendees"]:
        return ["<p id='checkpoints'>No attendee yet.</p>"]
    names = data["checkpoints"]
    out = ["<table id='checkpoints'><tr><th>attendee</th>" + "".join(f"<th>{esc(n)}</th>" for n in names)
           + "<th>reached</th></tr>"]
    for attendee in data["attendees"]:
        reached = attendee["reached"]
        cells = "".join(f"<td title='{esc(reached[n])}' class='passed'>&#10003;</td>" if n in reached else "<td></td>"
                        for n in names)
        count = f"{len(reached)} of {len(names)}" if names else "no checkpoint yet"
        out.append(f"<tr data-user='{esc(attendee['user'])}'><td>{esc(attendee['user'])}</td>{cells}"
                   f"<td class='n'>{count}</td></tr>")
    out.append("</table>")
    return out


def render(data: dict, joining: str | None = None) -> str:
    """The board's HTML page (it reloads itself every :data:`REFRESH_SECONDS`).

    ``joining``: the board's address as the viewer reached it, when it takes records over
    the network; the page then says how a checkout sends its checks here.
    """
    esc = html.escape
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<meta http-equiv='refresh' content='{REFRESH_SECONDS}'><title>Class board</title>",
        "<style>body{font:16px system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{padding:.25em .7em;text-align:left;border-bottom:1px solid #ddd}td.n{text-align:right;font-variant-numeric:tabular-nums}"
        ".bar{display:inline-flex;width:12em;height:1em;background:#eee}.seg{display:inline-block;height:100%}"
        f".passed{{color:{COLOURS['passed']}}}.failed{{color:{COLOURS['failed']}}}</style></head><body>",
        f"<h1>Class board</h1><p>Updated {esc(data['updated'])}; every check run in the room, latest run per attendee and part.</p>",
    ]
    if joining:
        out.append(f"<p id='joining'>Attendees send their checks here with <code>make configure "
                   f"PACKLAB_CLASS_URL={esc(joining)} PACKLAB_CLASS_TOKEN=&lt;the class token&gt;</code> "
                   "(the token <code>make board</code> printed).</p>")
    out.append("<h2>Attendees and checkpoints</h2>")
    out += _attendee_table(data)
    out.append("<h2>Stuck longest</h2>")
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


class BadRecord(ValueError):
    """A posted record the board does not store; the message says which field and why."""

    status = 400


class TooLarge(BadRecord):
    """A post larger than :data:`MAX_BODY`."""

    status = 413


def _text(entry: dict, key: str, pattern: re.Pattern | None = None) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value or len(value) > MAX_FIELD:
        raise BadRecord(f"{key!r} must be a string of 1 to {MAX_FIELD} characters")
    if pattern and not pattern.fullmatch(value):
        raise BadRecord(f"{key!r} = {value[:40]!r} is not a safe file name (letters, digits, '.', '_', '-'; up to 64)")
    return value


def validate(entry) -> dict:
    """The record as the board stores it (its known fields, in the class folder's order), or :class:`BadRecord`."""
    if not isinstance(entry, dict):
        raise BadRecord("a record must be a JSON object")
    clean = {"user": _text(entry, "user", records.SAFE_NAME)}
    if entry.get("kind") == records.CHECKPOINT:
        clean |= {"kind": records.CHECKPOINT, "checkpoint": _text(entry, "checkpoint", records.SAFE_NAME)}
    else:
        clean |= {key: _text(entry, key) for key in ("notebook", "check", "part")}
        if entry.get("status") not in records.STATUSES:
            raise BadRecord(f"'status' must be one of {', '.join(records.STATUSES)}")
        seconds = entry.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < 1e6:
            raise BadRecord("'seconds' must be a number of seconds")
        clean |= {"status": entry["status"], "seconds": seconds}
    stamp = _text(entry, "time")
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        raise BadRecord(f"'time' = {stamp[:40]!r} is not an ISO 8601 time") from None
    if when.tzinfo is None:  # the board sorts every record by time; naive and aware times do not compare
        raise BadRecord("'time' must carry its time zone (as records.py writes it: +00:00)")
    return clean | {"time": stamp, "run": _text(entry, "run")}


def _record_key(entry: dict) -> tuple:
    """What makes a record the same record when it arrives twice (sent late, and again from a queue)."""
    if entry.get("kind") == records.CHECKPOINT:
        return (entry["run"], records.CHECKPOINT, entry["checkpoint"])
    return (entry["run"], entry["check"], entry["part"])


class Store:
    """The posted records, in ``<folder>/<user>/<user>.jsonl`` (the hub's layout), each record once."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._seen: dict[str, set[tuple]] = {}

    def _file(self, user: str) -> Path:
        return records.records_file(self.folder / user, user)

    def _keys(self, user: str) -> set[tuple]:
        if user not in self._seen:  # a restarted board knows what it already has
            self._seen[user] = {_record_key(e) for e in records.read_records(self._file(user).parent)
                                if isinstance(e.get("run"), str)}
        return self._seen[user]

    def add(self, entries: list[dict]) -> tuple[int, int]:
        """Store the records not stored yet: ``(stored, already there)``."""
        fresh: dict[str, list[dict]] = {}
        for entry in entries:
            keys = self._keys(entry["user"])
            key = _record_key(entry)
            if key not in keys:
                keys.add(key)
                fresh.setdefault(entry["user"], []).append(entry)
        for user, new in fresh.items():
            target = self._file(user)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(e) + "\n" for e in new))
        stored = sum(len(new) for new in fresh.values())
        return stored, len(entries) - stored


def parse_post(body: bytes) -> list[dict]:
    """A post's records, validated: one record (a JSON object) or a list of them; :class:`BadRecord` otherwise."""
    if len(body) > MAX_BODY:
        raise TooLarge(f"the body is {len(body)} bytes; the most is {MAX_BODY}")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRecord("the body is not JSON") from None
    items = data if isinstance(data, list) else [data]
    if not items or len(items) > MAX_RECORDS:
        raise BadRecord(f"a post holds 1 to {MAX_RECORDS} records, not {len(items)}")
    out = []
    for number, item in enumerate(items, start=1):
        try:
            out.append(validate(item))
        except BadRecord as exc:
            raise BadRecord(f"record {number}: {exc}") from None
    return out


def _given_token(handler) -> str:
    header = handler.request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[len("Bearer "):].strip()
    return handler.get_argument("token", None) or handler.get_cookie(TOKEN_COOKIE) or ""


def _token_matches(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


def make_app(folder: Path, roster_path: Path | None, prefix: str = "/", hub: bool = False,
             token: str | None = None, page_token: bool = False):
    """The board's tornado application: the page at ``prefix``, ``prefix + 'data.json'``; with ``hub``, a hub login.

    With ``token``, ``prefix + 'records'`` takes posted records (``Authorization: Bearer
    <token>``) into ``folder``; with ``page_token`` too, the page and ``data.json`` want the
    token as well (``?token=`` once, then a cookie; or the header).
    """
    from tornado import web

    mixins: tuple = ()
    routes = []
    if hub:
        from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated

        mixins = (HubOAuthenticated,)
        routes.append((prefix + "oauth_callback", HubOAuthCallbackHandler))
    store = Store(folder) if token else None

    def current() -> dict:
        return board_data(folder, read_roster(roster_path))

    def let_in(handler) -> bool:
        """Whether the viewer may see the board: always without ``page_token``; else with the token."""
        if not page_token:
            return True
        given = _given_token(handler)
        if given and _token_matches(given, token):
            if handler.get_argument("token", None):
                # Kept in a cookie, and out of the address bar (and of a screen the room can see).
                handler.set_cookie(TOKEN_COOKIE, given, path=prefix, httponly=True, samesite="Strict",
                                   expires_days=2)
                handler.redirect(handler.request.path)
                return False
            return True
        handler.set_status(401)
        handler.set_header("Content-Type", "text/plain; charset=utf-8")
        handler.finish(f"This board wants the class token: open {handler.request.protocol}://{handler.request.host}"
                       f"{prefix}?token=<the class token> once (make board printed it); a cookie then keeps it.\n")
        return False

    class Page(*mixins, web.RequestHandler):
        @web.authenticated if hub else (lambda f: f)
        def get(self):
            if not let_in(self):
                return
            self.set_header("Cache-Control", "no-store")
            joining = f"{self.request.protocol}://{self.request.host}{prefix.rstrip('/')}" if token else None
            self.write(render(current(), joining))

    class Data(*mixins, web.RequestHandler):
        @web.authenticated if hub else (lambda f: f)
        def get(self):
            if not let_in(self):
                return
            self.set_header("Cache-Control", "no-store")
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(current()))

    class Records(web.RequestHandler):
        def post(self):
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            header = self.request.headers.get("Authorization", "")
            if not (header.startswith("Bearer ") and _token_matches(header[len("Bearer "):].strip(), token)):
                self.set_status(401)
                self.finish("wrong or missing class token: send the header 'Authorization: Bearer <the class token>'\n")
                return
            try:
                entries = parse_post(self.request.body)
            except BadRecord as exc:
                self.set_status(exc.status)
                self.finish(f"{exc}\n")
                return
            stored, known = store.add(entries)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"stored": stored, "already_stored": known}))

    routes += [(prefix, Page), (prefix + "data.json", Data)]
    if store is not None:
        routes.append((prefix + "records", Records))
    return web.Application(routes, cookie_secret=os.urandom(32))


def lan_address() -> str:
    """This machine's address on its network, as the attendees' laptops would reach it (best guess).

    A UDP socket "connected" to a private address sends nothing; it only makes the system
    pick the interface, whose address is then ours.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.hub.board", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="the class folder the checks record into")
    parser.add_argument("--roster", type=Path, default=None, help="the class list (one name a line): who has not started")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (0.0.0.0: every network of this machine, for a laptop room)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--token", default=os.environ.get("BOARD_TOKEN") or None,
                        help="the class token the attendees' posts carry (default $BOARD_TOKEN, else one made now)")
    parser.add_argument("--hub", action="store_true", help="run as the hub's service (its login, at its service prefix)")
    args = parser.parse_args(argv)
    from tornado import ioloop

    if args.hub:
        prefix, token, page_token = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/"), None, False
    else:
        if args.token is not None and not TOKEN_PATTERN.fullmatch(args.token):
            parser.error("--token / BOARD_TOKEN: 8 to 128 letters, digits or . _ ~ - (it goes into settings.mk as it is)")
        prefix, token = "/", args.token or secrets.token_urlsafe(18)
        page_token = args.host not in LOOPBACK  # beyond this machine, whoever can reach it may not read it
    app = make_app(args.records, args.roster, prefix, args.hub, token, page_token)
    # Up to twice MAX_BODY is read and refused with a message (413); beyond it tornado drops the connection unread.
    app.listen(args.port, address=args.host, max_body_size=2 * MAX_BODY)
    shown = lan_address() if args.host in ("0.0.0.0", "::", "") else args.host
    print(f"class board of {args.records} on http://{shown}:{args.port}{prefix} (Ctrl+C stops it)", flush=True)
    if token:
        print(f"class token: {token}\n"
              f"each attendee, once, in their checkout: make configure PACKLAB_CLASS_URL=http://{shown}:{args.port} "
              f"PACKLAB_CLASS_TOKEN={token}", flush=True)
        if page_token:
            print(f"open the board: http://{shown}:{args.port}{prefix}?token={token}", flush=True)
    ioloop.IOLoop.current().start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
