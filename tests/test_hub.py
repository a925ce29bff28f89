"""The hub's parts that need no hub running: the class list, the passwords, the board's counts, the configuration.

The hub itself, in a browser, is ``tests/test_hub_browser.py``.
"""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timedelta, timezone

import pytest
from traitlets.config import Config

from packlab.course.hub import accounts, board, config


def test_the_class_list_names_people_and_instructors(tmp_path):
    path = tmp_path / "class.txt"
    path.write_text("# room B\nana\nben, \n\nlee instructor  # runs the room\n")
    assert accounts.read_people(path) == [accounts.Person("ana"), accounts.Person("ben"), accounts.Person("lee", True)]
    assert accounts.read_class_list(path) == ["ana", "ben"]


@pytest.mark.parametrize("text, says", [
    ("ana\nAna Smith\n", "line 2: 'Ana' is not a usable name"),
    ("ana\nana\n", "line 2: 'ana' is on the list twice"),
    ("ana teacher\n", "line 1: after the name only the word 'instructor'"),
    ("lee instructor\n", "names no attendee"),
])
def test_a_bad_class_list_is_refused_naming_the_file_and_line(tmp_path, text, says):
    path = tmp_path / "class.txt"
    path.write_text(text)
    with pytest.raises(accounts.ClassListError) as raised:
        accounts.read_people(path)
    assert str(path) in str(raised.value) and says in str(raised.value)


def test_every_person_gets_a_password_once_and_only_hashes_are_kept_for_the_hub(tmp_path):
    people = [accounts.Person("ana"), accounts.Person("lee", True)]
    plain_path, accounts_path = accounts.ensure_accounts(people, tmp_path)
    assert stat.S_IMODE(os.stat(plain_path).st_mode) == 0o600
    first = dict(line.split()[:2] for line in plain_path.read_text().splitlines() if not line.startswith("#"))
    known = json.loads(accounts_path.read_text())
    assert first["ana"] not in accounts_path.read_text(), "accounts.json holds hashes, not passwords"
    assert accounts.verify(known, "ana", first["ana"]) and not accounts.verify(known, "ana", first["lee"])
    assert known["lee"]["instructor"] and not known["ana"]["instructor"]
    accounts.ensure_accounts(people + [accounts.Person("ben")], tmp_path)
    second = dict(line.split()[:2] for line in plain_path.read_text().splitlines() if not line.startswith("#"))
    assert second["ana"] == first["ana"] and "ben" in second, "a new name must not change the others' passwords"


def _entry(user, part, status, minutes, check="shard_split"):
    when = datetime(2026, 11, 28, 10, 0, tzinfo=timezone.utc) + timedelta(minutes=minutes)
    return {"user": user, "notebook": "05_shard_split", "check": check, "part": part, "status": status,
            "time": when.isoformat(), "when": when}


def test_the_board_counts_each_attendees_latest_run_and_lists_who_is_stuck_longest():
    entries = [
        _entry("ana", "balanced", "passed", 0), _entry("ana", "balanced", "failed", 5), _entry("ana", "balanced", "failed", 9),
        _entry("ben", "balanced", "failed", 1), _entry("ben", "balanced", "passed", 8),
        _entry("dan", "balanced", "failed", 2),
        _entry("dan", "pure", "not started", 2),
    ]
    rows, stuck = board.summarise(entries, roster=["ana", "ben", "chen", "dan"])
    balanced = next(r for r in rows if r.part == "balanced")
    assert (balanced.passed, balanced.failed, balanced.not_started) == (["ben"], ["ana", "dan"], ["chen"])
    pure = next(r for r in rows if r.part == "pure")
    assert pure.not_started == ["ana", "ben", "chen", "dan"]
    assert len([r for r in rows if r.check == "rank_dataset"]) == 4, "every registered part of the exercise is shown"
    assert [(s.user, s.runs) for s in stuck] == [("dan", 1), ("ana", 2)], "longest stuck first; ana since her pass"
    now = datetime(2026, 11, 28, 10, 30, tzinfo=timezone.utc)
    assert stuck[0].minutes(now) == 28.0


def test_the_board_page_shows_the_counts_and_escapes_names(tmp_path):
    folder = tmp_path / "records" / "x"
    folder.mkdir(parents=True)
    lines = [_entry("<b>eve</b>", "balanced", "failed", 0), _entry("ana", "balanced", "passed", 1)]
    (folder / "x.jsonl").write_text("\n".join(json.dumps({k: v for k, v in e.items() if k != "when"}) for e in lines)
                                    + "\nnot json\n")
    data = board.board_data(tmp_path / "records", now=datetime(2026, 11, 28, 11, 0, tzinfo=timezone.utc))
    assert data["stuck"][0]["user"] == "<b>eve</b>" and data["stuck"][0]["minutes"] == 60.0
    page = board.render(data)
    assert "<b>eve</b>" not in page and "&lt;b&gt;eve&lt;/b&gt;" in page
    assert "tr data-part='shard_split/balanced'><td>shard_split / balanced</td><td class='n passed'>1</td>" \
           "<td class='n failed'>1</td><td class='n'>0</td>" in page
    assert f"content='{board.REFRESH_SECONDS}'" in page


def test_the_hub_configuration_from_its_settings(tmp_path):
    settings = {"url": "http://127.0.0.1:8000", "people": {"ana": "attendee", "lee": "instructor"}, "release": "/r",
                "environment": "/env", "python": "/env/bin/python", "count": 2000, "idle_timeout": 3600, "sandboxed": True,
                "proxy": "/chp", "hub_port": 1, "proxy_api_port": 2, "board_port": 3}
    config_file = config.write(tmp_path, settings)
    assert "configure(get_config()" in config_file.read_text()
    c = Config()
    config.configure(c, tmp_path)
    assert c.Authenticator.allowed_users == {"ana", "lee"} and c.Authenticator.admin_users == {"lee"}
    assert c.JupyterHub.spawner_class.endswith("CourseSpawner") and c.CourseSpawner.small_count == "2000"
    assert c.CourseSpawner.cores == "", "settings without a share of the cores cap nothing"
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert "--timeout=3600" in services["idle-culler"]["command"]
    assert services["board"]["url"] == "http://127.0.0.1:3" and services["board"]["oauth_no_confirm"]
    assert c.JupyterHub.load_roles[0]["scopes"] == config.CULLER_SCOPES
    assert c.ConfigurableHTTPProxy.command == ["/chp"]
    config.write(tmp_path, {**settings, "cores": 4})
    c = Config()
    config.configure(c, tmp_path)
    assert c.CourseSpawner.cores == "4"


def test_each_attendee_gets_a_share_of_the_cores(monkeypatch):
    from packlab.course.hub import cli

    monkeypatch.setattr("packlab.cpus.affinity_cores", lambda: 16)
    assert cli.attendee_cores(4) == 4 and cli.attendee_cores(5) == 3 and cli.attendee_cores(40) == 1
