"""The hub's parts that need no hub running: the class list, the passwords, the board's counts, the configuration.

The hub itself, in a browser, is ``tests/test_hub_browser.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from traitlets.config import Config

from packlab import paths
from packlab.course.hub import accounts, board, config, slices


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
    assert c.CourseSpawner.cores_per_attendee == 2 and c.CourseSpawner.oversubscribe is False, \
        "settings without a slice size give each server 2 cores, and refuse past the slices"
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert "--timeout=3600" in services["idle-culler"]["command"]
    assert services["board"]["url"] == "http://127.0.0.1:3" and services["board"]["oauth_no_confirm"]
    assert c.JupyterHub.load_roles[0]["scopes"] == config.CULLER_SCOPES
    assert c.ConfigurableHTTPProxy.command == ["/chp"]
    config.write(tmp_path, {**settings, "cores_per_attendee": 4, "oversubscribe": True})
    c = Config()
    config.configure(c, tmp_path)
    assert c.CourseSpawner.cores_per_attendee == 4 and c.CourseSpawner.oversubscribe is True


def test_slices_are_handed_out_round_robin_released_and_reused(tmp_path):
    record = tmp_path / slices.SLICES_FILE
    allocator = slices.SliceAllocator([0, 1, 2, 3, 4, 5, 6], per_attendee=2, record=record)
    assert allocator.slices == [(0, 1), (2, 3), (4, 5)], "core 6, less than a slice, is left to the hub"
    ana, ben = allocator.assign("ana"), allocator.assign("ben")
    assert (ana.cores, ben.cores) == ((0, 1), (2, 3)) and not ana.shared
    assert allocator.assign("ana") == ana, "a second start of the same server keeps its slice"
    allocator.release("ana")
    assert allocator.assign("chen").cores == (4, 5), "round-robin: the next slice, not the one just freed"
    assert allocator.assign("dan").cores == (0, 1), "the freed slice is reused when it is the only free one"
    written = json.loads(record.read_text())
    assert written["servers"] == {"ben": {"cores": [2, 3], "shared": False}, "chen": {"cores": [4, 5], "shared": False},
                                  "dan": {"cores": [0, 1], "shared": False}}
    assert written["capacity"] == 3 and written["cores_per_attendee"] == 2


def test_past_the_slices_the_hub_refuses_with_a_message_for_the_spawn_page_unless_oversubscribed():
    from jupyterhub.utils import format_exception

    full = slices.SliceAllocator([0, 1, 2, 3], per_attendee=2)
    full.assign("ana"), full.assign("ben")
    with pytest.raises(slices.NoSliceFree) as refused:
        full.assign("chen")
    message, _ = format_exception(refused.value)  # what JupyterHub's progress page prints after "Spawn failed: "
    assert message.startswith("The hub is full: all 2 slices of 2 cores are in use") and "Stop My Server" in message
    full.release("ben")
    assert full.assign("chen").cores == (2, 3), "a stopped server's slice lets the next one start"

    shared = slices.SliceAllocator([0, 1, 2, 3], per_attendee=2, oversubscribe=True)
    given = [shared.assign(name) for name in ("ana", "ben", "chen", "dan", "eve")]
    assert [g.cores for g in given] == [(0, 1), (2, 3), (0, 1), (2, 3), (0, 1)], "shared round-robin, fewest first"
    assert shared.holder_of("ana").shared and shared.holder_of("eve").shared
    assert slices.capacity(2, 2) == 1 and slices.capacity(1, 2) == 1 and slices.capacity(64, 2) == 32
    assert slices.SliceAllocator([0], per_attendee=2).slices == [(0,)], "one core: one server, on it"


def _spawner(tmp_path, name, **traits):
    from types import SimpleNamespace

    from packlab.course.hub import server

    user = SimpleNamespace(name=name, url=f"/user/{name}/", server=None, escaped_name=name)
    return server.CourseSpawner(user=user, hub_folder=str(tmp_path), release_repository=str(tmp_path / "release"),
                                sandboxed=False, **traits)


@pytest.fixture
def four_cores(monkeypatch):
    from packlab.course.hub import server

    monkeypatch.setattr(slices, "hub_cores", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(server.CourseSpawner, "_allocators", {})
    monkeypatch.setattr(server.CourseSpawner, "prepare", lambda self: None)

    async def started(self):  # LocalProcessSpawner.start, without a process
        return ("127.0.0.1", 1)

    monkeypatch.setattr(server.SimpleLocalProcessSpawner, "start", started)


def test_the_spawner_runs_each_server_on_its_slice_and_sets_packlab_cores(tmp_path, four_cores):
    ana, ben, chen = (_spawner(tmp_path, name) for name in ("ana", "ben", "chen"))
    asyncio.run(ana.start())
    asyncio.run(ben.start())
    assert ana.cmd[1:3] == ["-c", "0,1"] and Path(ana.cmd[0]).name == "taskset"
    assert ben.cmd[1:3] == ["-c", "2,3"] and any(part.endswith("jupyterhub-singleuser") for part in ben.cmd)
    assert ana.user_env({})["PACKLAB_CORES"] == "2"
    assert ana.get_state()["slice"] == [0, 1]
    with pytest.raises(slices.NoSliceFree):
        asyncio.run(chen.start())
    ana.clear_state()  # what JupyterHub calls when the server has stopped or died
    assert ana.core_slice is None and "PACKLAB_CORES" not in ana.user_env({})
    asyncio.run(chen.start())
    assert chen.cmd[2] == "0,1"
    assert json.loads((tmp_path / slices.SLICES_FILE).read_text())["servers"]["chen"]["cores"] == [0, 1]


def test_an_oversubscribed_hub_starts_every_server_on_shared_slices(tmp_path, four_cores):
    spawners = [_spawner(tmp_path, name, oversubscribe=True) for name in ("ana", "ben", "chen")]
    for spawner in spawners:
        asyncio.run(spawner.start())
    assert [s.cmd[2] for s in spawners] == ["0,1", "2,3", "0,1"] and spawners[2].core_slice.shared


def test_the_affinity_prefix_really_confines_the_process(tmp_path, four_cores, monkeypatch):
    own = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(slices, "hub_cores", lambda: own)  # this machine's real cores, one to a server
    spawner = _spawner(tmp_path, "ana", cores_per_attendee=1)
    asyncio.run(spawner.start())
    prefix = spawner.cmd[:3]
    seen = subprocess.run([*prefix, sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                          capture_output=True, text=True, check=True).stdout
    assert seen.strip() == str([own[0]])


def test_the_hub_writes_a_systemd_unit_that_runs_the_same_hub(tmp_path, monkeypatch):
    from packlab.course.hub import cli

    command = cli.hub_command(tmp_path / "jupyterhub_config.py")
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cli.pwd, "getpwuid", lambda uid: type("Entry", (), {"pw_name": "teacher"}))
    unit = cli.unit_file(tmp_path, command, "/opt/node-22/bin/node")
    lines = unit.splitlines()
    assert f"ExecStart={sys.executable} -m jupyterhub -f {tmp_path / 'jupyterhub_config.py'}" in lines
    assert "Restart=on-failure" in lines and f"WorkingDirectory={tmp_path}" in lines and "User=teacher" in lines
    assert any(line.startswith("Environment=PATH=") and "/opt/node-22/bin" in line for line in lines)
    assert "WantedBy=multi-user.target" in lines
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    assert "User=" not in cli.unit_file(tmp_path, command, None)
    said = cli.how_to_run(tmp_path, command)
    assert f"systemctl link {tmp_path / cli.SERVICE}" in said and "enable --now packed-data-hub" in said
    assert "tmux new -s hub" in said


def test_tls_files_reach_jupyterhub_and_plain_http_beyond_loopback_is_named(tmp_path):
    from packlab.course.hub import cli

    settings = {"url": "http://0.0.0.0:8000", "people": {"ana": "attendee"}, "release": "/r", "environment": "/env",
                "count": 2000, "idle_timeout": 9000, "sandboxed": True, "proxy": "/chp", "hub_port": 1,
                "proxy_api_port": 2, "board_port": 3, "ssl_cert": "/etc/hub/cert.pem", "ssl_key": "/etc/hub/key.pem"}
    config.write(tmp_path, settings)
    c = Config()
    config.configure(c, tmp_path)
    assert (c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key) == ("/etc/hub/cert.pem", "/etc/hub/key.pem")
    assert c.JupyterHub.bind_url == "https://0.0.0.0:8000"
    assert cli.listens_beyond_loopback("http://0.0.0.0:8000") and cli.listens_beyond_loopback("http://10.1.2.3:8000")
    assert not cli.listens_beyond_loopback("http://127.0.0.1:8000") and not cli.listens_beyond_loopback("http://localhost:8000")


def test_prepare_refuses_half_a_tls_pair_and_names_what_needs_root(tmp_path, monkeypatch):
    from packlab.course.hub import cli

    class_list = tmp_path / "class.txt"
    class_list.write_text("ana\n")
    proxy = tmp_path / "chp"
    proxy.write_text("")
    with pytest.raises(SystemExit, match="both --ssl-cert and --ssl-key"):
        cli.prepare(class_list, tmp_path / "hub", proxy=proxy, ssl_cert=proxy)
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match="ports below 1024 need root"):
        cli.prepare(class_list, tmp_path / "hub", url="http://0.0.0.0:443", proxy=proxy)
    monkeypatch.setattr(cli.sandbox, "why_unavailable", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(SystemExit, match="needs root once for this: to install bubblewrap") as stopped:
        cli.prepare(class_list, tmp_path / "hub", proxy=proxy)
    assert "Nothing else of the hub needs root" in str(stopped.value)
    assert cli.needs_root("http://127.0.0.1:8000", sandboxed=False) is None, "a normal account runs the hub"


def test_idle_servers_are_culled_after_two_and_a_half_hours_by_default(tmp_path):
    from packlab.course.hub import cli

    assert cli.IDLE_TIMEOUT == 9000
    settings = {"url": "http://127.0.0.1:8000", "people": {"ana": "attendee"}, "release": "/r", "environment": "/env",
                "count": 2000, "idle_timeout": cli.IDLE_TIMEOUT, "sandboxed": True, "proxy": "/chp", "hub_port": 1,
                "proxy_api_port": 2, "board_port": 3}
    config.write(tmp_path, settings)
    c = Config()
    config.configure(c, tmp_path)
    culler = next(s for s in c.JupyterHub.services if s["name"] == "idle-culler")
    assert "--timeout=9000" in culler["command"]


def _make_hub_proxy(tmp_path, node_version):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if node_version:
        (bin_dir / "node").write_text(f"#!/bin/sh\necho {node_version}\n")
        (bin_dir / "node").chmod(0o755)
    (bin_dir / "npm").write_text(f"#!/bin/sh\necho npm ran >> {tmp_path / 'npm.log'}\nexit 1\n")
    (bin_dir / "npm").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    # a real node in /usr/bin would answer where no fake is given: the fake comes first on PATH
    return subprocess.run(["make", "-s", "-C", str(paths.repo_root()), "hub-proxy", f"TOOLS={tmp_path / 'tools'}"],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("version, says", [
    ("v18.19.0", "found: v18.19.0"),
    ("v8.1.0", "found: v8.1.0"),
])
def test_make_hub_proxy_checks_nodes_version_before_npm_runs(tmp_path, version, says):
    done = _make_hub_proxy(tmp_path, version)
    assert done.returncode != 0
    assert "make hub needs node 20 or newer" in done.stdout and says in done.stdout, done.stdout + done.stderr
    assert "nodejs.org" in done.stdout
    assert not (tmp_path / "npm.log").exists(), "npm ran before node's version was checked"


def test_make_hub_proxy_goes_on_to_npm_with_node_20(tmp_path):
    done = _make_hub_proxy(tmp_path, "v20.19.1")
    assert "needs node 20" not in done.stdout and (tmp_path / "npm.log").read_text() == "npm ran\n"
