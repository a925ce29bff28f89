"""Checks that speak while they run, and every run recorded for the class board.

* In a kernel, ``check()`` keeps one display on screen: each part's line appears when the
  part starts, with its limit, and is replaced in place by its result; a hanging part
  shows its running time before its limit stops it.
* In a log (no terminal), a line when a part starts and one when it ends.
* With ``PACKLAB_CLASS_RECORDS`` set, every part of every run is appended to
  ``<folder>/<user>.jsonl`` (user, notebook, check, part, status, time); partial checks
  too, demonstrations (``record=False``) not.
"""

from __future__ import annotations

import io
import json
import time

from packlab.course.grading import check, live, records

ROOT_SHARDS = [f"shard-{i:02d}.tar" for i in range(7)]


def shards_for(shards, rank, world_size, worker_id, num_workers):
    if len(shards) < world_size * num_workers:
        raise ValueError(f"{len(shards)} shards for {world_size * num_workers} readers")
    return list(shards[rank::world_size][worker_id::num_workers])


def shards_for_stub(shards, rank, world_size, worker_id, num_workers):
    raise NotImplementedError("your code here")


def shards_for_that_hangs(shards, rank, world_size, worker_id, num_workers):
    time.sleep(3600)


class FakeHandle:
    def __init__(self, shown):
        self.shown = shown

    def update(self, data, raw=False):
        self.shown.append(("update", data["text/plain"]))


class FakeDisplay:
    """IPython's display(..., display_id=True), as a kernel has it: one handle, updated in place."""

    def __init__(self):
        self.shown = []

    def __call__(self, data, raw=False, display_id=False):
        assert raw and display_id is True
        self.shown.append(("display", data["text/plain"]))
        return FakeHandle(self.shown)


def test_in_a_kernel_each_part_shows_as_it_starts_with_its_limit_then_its_result(monkeypatch, capsys):
    display = FakeDisplay()
    monkeypatch.setattr(live, "_kernel_display", lambda: display)
    result = check("shard_split", shards_for, part_timeout=90)
    assert result.passed
    kinds = [kind for kind, _ in display.shown]
    assert kinds[0] == "display" and set(kinds[1:]) == {"update"}, "one display, updated in place"
    texts = [text for _, text in display.shown]
    first_part = result.parts[0].name
    started = next(i for i, t in enumerate(texts) if f"… {first_part}" in t)
    assert "limit 90 s" in texts[started] and "✓" not in texts[started].split(first_part)[1].splitlines()[0]
    finished = next(i for i, t in enumerate(texts) if f"✓ {first_part}" in t)
    assert finished > started, "the result replaces the running line"
    assert all(f"✓ {p.name}" in texts[-2] for p in result.parts), "before closing, every part shows its result"
    assert texts[-1].endswith(f"{len(result.parts)} ran"), "at the end the block shrinks to one line"
    assert "5/5 parts passed" in capsys.readouterr().out, "the report follows as before"


def test_a_hanging_part_shows_its_running_time_before_its_limit_stops_it(monkeypatch):
    display = FakeDisplay()
    monkeypatch.setattr(live, "_kernel_display", lambda: display)
    monkeypatch.setattr(live, "TICK_SECONDS", 0.5)
    result = check("shard_split", shards_for_that_hangs, parts=["exactly_once"], part_timeout=3, quiet=False)
    assert not result.passed and "did not finish within 3 s" in result.parts[0].message
    texts = [text for _, text in display.shown]
    assert any("running 1 s (limit 3 s)" in t or "running 2 s (limit 3 s)" in t for t in texts), texts
    assert "✗ exactly_once" in texts[-2]


def test_in_a_log_a_line_when_a_part_starts_and_one_when_it_ends():
    stream = io.StringIO()
    progress = live.Progress("check 'x' on y: 2 parts", ["one", "two"], 180, stream=stream)
    progress.started(0)
    progress.tick()  # a log gets no extra lines
    progress.finished(0, "passed", 0.25)
    progress.started(1)
    progress.finished(1, "not started", 0.0)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "check 'x' on y: 2 parts"
    assert lines[1].startswith("  … one") and "limit 180 s" in lines[1]
    assert lines[2] == "  ✓ one  0.2 s" or lines[2] == "  ✓ one  0.3 s"
    assert lines[4].startswith("  · two") and lines[4].endswith("(not started)")
    assert len(lines) == 5


def test_a_quiet_check_shows_nothing(monkeypatch, capsys):
    display = FakeDisplay()
    monkeypatch.setattr(live, "_kernel_display", lambda: display)
    check("shard_split", shards_for, parts=["pure"], quiet=True)
    assert display.shown == [] and capsys.readouterr().out == ""


def test_every_run_is_recorded_for_the_class_board(tmp_path, monkeypatch):
    monkeypatch.setenv(records.CLASS_RECORDS_ENV_VAR, str(tmp_path))
    monkeypatch.setenv("PACKLAB_USER", "ana")
    check("shard_split", shards_for_stub, quiet=True)
    check("shard_split", shards_for, parts="pure", quiet=True)  # one part: recorded too
    check("shard_split", shards_for, quiet=True, record=False)  # a demonstration: not recorded
    lines = [json.loads(line) for line in (tmp_path / "ana.jsonl").read_text().splitlines()]
    assert [(e["part"], e["status"]) for e in lines] == [
        ("exactly_once", "not started"), ("balanced", "not started"), ("rank_first", "not started"),
        ("too_few_shards", "not started"), ("pure", "not started"), ("pure", "passed")]
    assert {e["user"] for e in lines} == {"ana"} and {e["notebook"] for e in lines} == {"05_shard_split"}
    assert {e["check"] for e in lines} == {"shard_split"} and len({e["run"] for e in lines}) == 2
    read = records.read_records(tmp_path)
    assert len(read) == 6 and read[0]["when"] <= read[-1]["when"]


def test_a_class_folder_that_cannot_be_written_costs_a_warning_not_the_check(tmp_path, monkeypatch, recwarn):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv(records.CLASS_RECORDS_ENV_VAR, str(blocked))
    result = check("shard_split", shards_for, parts=["pure"], quiet=True)
    assert result.passed
    assert any("class board" in str(w.message) for w in recwarn.list)


def test_the_user_name_comes_from_packlab_user_then_the_hub(monkeypatch):
    monkeypatch.delenv("PACKLAB_USER", raising=False)
    monkeypatch.setenv("JUPYTERHUB_USER", "ben")
    assert records.user_name() == "ben"
    monkeypatch.setenv("PACKLAB_USER", "ana")
    assert records.user_name() == "ana"
    assert records.records_file(records.Path("/x"), "a/b c").name == "a_b_c.jsonl"
