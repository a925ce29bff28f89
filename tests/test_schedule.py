"""The workshop schedule (packlab.course.schedule): its counts, its coverage of the book, its errors."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from packlab import paths
from packlab.course import schedule

ROOT = paths.repo_root()

SYNTHETIC = textwrap.dedent(
    """\
    ---
    jupytext:
      text_representation:
        format_name: myst
    ---

    (tiny-label)=
    # A tiny chapter

    Two sentences of prose, seven words. And {eval}`rate` here.

    <!-- an instructor's note
    that spans two lines -->
    % a MyST comment
    ```{admonition} Look
    :class: note
    One word.
    ```

    ```{code-cell} ipython3
    # code is not prose: these words do not count
    x = 1
    ```

    +++

    Last line, `inline code` counts.

    ````{code-cell} ipython3
    print('''
    ```
    a fence inside a string does not end the cell
    ''')
    ````
    """
)


def test_words_and_cells_of_a_synthetic_notebook(tmp_path):
    path = tmp_path / "tiny.md"
    path.write_text(SYNTHETIC, encoding="utf-8")
    counted = schedule.count_notebook(path)
    # "A tiny chapter" 3 (the # is not a word), the prose line 9, "One word." 2,
    # "Last line, `inline code` counts." 5; front matter, label, comments, fences,
    # options and both code cells left out.
    assert counted == schedule.NotebookText(words=3 + 9 + 2 + 5, code_cells=2, predicts=0, try_its=0)


def test_solution_lines_count_only_code_between_the_markers(tmp_path):
    path = tmp_path / "01_x.md"
    path.write_text(
        textwrap.dedent(
            """\
            ```{code-cell} ipython3
            def f(x):
                # BEGIN SOLUTION
                # Hint: add one
                y = x + 1

                return y
                # END SOLUTION
            z = f(1)
            ```
            """
        ),
        encoding="utf-8",
    )
    assert schedule.solution_lines(path) == 2


def test_the_table_has_a_row_for_every_chapter_of_the_toc():
    chapters = schedule.toc_chapters(ROOT)
    assert len(chapters) >= 11, chapters
    rows = schedule.sessions(ROOT, seconds={}, parts={})
    assert [row.chapter for row in rows] == chapters
    table = schedule.markdown_table(rows)
    for chapter in chapters:
        name = Path(chapter).name
        assert re.search(rf"^\| {schedule.chapter_number(chapter)} \| {name} \|", table, re.M), name
    # every row has an estimate; nothing was measured here, so running reads n/a
    assert all(row.read_min > 0 and row.run_min is None for row in rows)


def test_every_exercise_of_the_toc_belongs_to_a_chapter():
    placed = {name for names in schedule.exercises_by_chapter(ROOT).values() for name in names}
    for exercise in schedule.toc_exercises(ROOT):
        assert Path(exercise).name in placed, f"{exercise} has no chapter in exercises/index.md's table"


def _schedule_section(page: str) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    match = re.search(r"^## Schedule\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{page} has no '## Schedule' section"
    return match.group(1)


def test_the_intro_schedule_names_every_chapter():
    section = _schedule_section("intro.md")
    for chapter in schedule.toc_chapters(ROOT):
        assert f"{{doc}}`{chapter}`" in section, f"intro.md's schedule does not list {chapter}"


def test_the_instructor_schedule_is_computed_when_the_book_builds():
    section = _schedule_section("instructor.md")
    assert "python -m packlab.course.schedule" in section
    assert "{nb-exec-table}" in section
    for request in ("summary", "table", "track 1", "track 1-shards", "track 2"):
        assert f"```{{course-schedule}} {request}\n```" in section, request
    assert "```{course-schedule} track 4\n```" in _schedule_section("intro.md")


_TYPED_TIME = re.compile(r"^\s*\|?\s*\d{1,2}:\d\d\s*[-–]\s*\d{1,2}:\d\d|\|\s*Minutes\s*\||Live ×|\(about \d+(\.\d)? hours")


def test_no_page_holds_a_hand_typed_timetable():
    # Clock-time rows, a Minutes or Live column, "about 5.8 hours": the book computes these ({course-schedule}).
    for page in ("intro.md", "instructor.md"):
        section = _schedule_section(page)
        typed = [line for line in section.splitlines() if _TYPED_TIME.search(line) and "course-schedule" not in line]
        assert not typed, f"{page} types what the book computes: {typed[:3]}"


def test_a_missing_cache_is_a_message_not_a_traceback(tmp_path, capsys):
    missing = tmp_path / "no-such-build" / ".jupyter_cache"
    assert schedule.main(["--cache", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err
    assert "make test" in err and "make book" in err
    assert "Traceback" not in err
    assert not missing.exists(), "looking for the cache must not create one"


def test_running_times_come_from_the_newest_record_of_each_notebook(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(tmp_path / "cache"))
    for code, uri, seconds in [
        ("a = 1", "/elsewhere/repo/chapters/01_x.md", 30.0),
        ("a = 2", "/elsewhere/repo/chapters/01_x.md", 42.0),  # the chapter re-run after a change
        ("b = 1", "/elsewhere/repo/solutions/01_y.md", 7.5),
    ]:
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        cache.cache_notebook_bundle(
            CacheBundleIn(notebook, uri, data={"execution_seconds": seconds}), check_validity=False
        )
    assert schedule.execution_seconds(tmp_path / "cache") == {"chapters/01_x": 42.0, "solutions/01_y": 7.5}


def test_the_timetable_keeps_every_minute_and_every_break():
    items = [("one", 100), ("two", 120), ("three", 150)]
    lines = schedule.timetable(items)
    spans = []
    for line in lines:
        match = re.match(r"(\d+):(\d\d)-(\d+):(\d\d) (.*)", line)
        assert match, line
        h1, m1, h2, m2, what = match.groups()
        spans.append((int(h1) * 60 + int(m1), int(h2) * 60 + int(m2), what))
    assert spans[0][0] == schedule.DAY_START
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), lines  # no gap, no overlap
    assert [s[2] for s in spans if s[2] in ("coffee", "lunch")] == [b[0] for b in schedule.BREAKS]
    taught = sum(end - start for start, end, what in spans if what not in ("coffee", "lunch"))
    assert abs(taught - sum(minutes for _, minutes in items)) <= len(lines)  # rounding to minutes


def test_every_chapter_is_taught_on_one_of_the_two_days():
    numbers = [schedule.chapter_number(c) for c in schedule.toc_chapters(ROOT)]
    assert not set(schedule.CORE_CHAPTERS) & set(schedule.SECOND_DAY_CHAPTERS)
    assert sorted(schedule.CORE_CHAPTERS + schedule.SECOND_DAY_CHAPTERS) == sorted(numbers)
    exercises = {Path(e).name for e in schedule.toc_exercises(ROOT)}
    planned = schedule.CORE_EXERCISES + schedule.SECOND_DAY_EXERCISES
    assert set(planned) <= exercises, set(planned) - exercises


# ------------------------------------------------------------------ teaching live


def _rows():
    return [
        schedule.Session("chapters/00_setup", 100, 2, read_min=10.0, run_min=1.0),
        schedule.Session("chapters/01_jpeg_files", 1000, 10, read_min=40.0, run_min=2.0, exercise="01_jpeg_dataset",
                         exercise_min=30.0),
    ]


def test_live_teaching_multiplies_reading_and_exercises_not_running():
    rows = _rows()
    items = dict(schedule.day_plan(rows, (0, 1), ("01_jpeg_dataset",), factor=1.5, setup_minutes=30))
    assert items == {schedule.SETUP_ITEM: 30.0, "chapter 0 (00_setup)": 16.0, "chapter 1 (01_jpeg_files)": 62.0,
                     "exercise 01_jpeg_dataset": 45.0}
    assert dict(schedule.day_plan(rows, (0, 1), ("01_jpeg_dataset",))) == {
        "chapter 0 (00_setup)": 11.0, "chapter 1 (01_jpeg_files)": 42.0, "exercise 01_jpeg_dataset": 30.0}
    table = schedule.markdown_table(rows, factor=1.5)
    assert "Live ×1.5 (min)" in table and re.search(r"\| 72 \| 107 \|$", table, re.M)


def test_the_first_day_starts_with_the_setup_slot():
    lines = schedule.timetable(schedule.day_plan(_rows(), (0, 1), (), factor=1.5, setup_minutes=30))
    assert lines[0] == f"9:00-9:30 {schedule.SETUP_ITEM}"
    report = schedule.report(_rows(), factor=1.5, setup_minutes=30)
    assert "9:00-9:30 introductions and set-up" in report and "× 1.5" in report


def test_sessions_that_overflow_two_days_are_packed_into_more():
    items = [(f"item {i}", 150.0) for i in range(7)]
    days = schedule.pack_days(items, minutes_per_day=390)
    assert [len(day) for day in days] == [2, 2, 2, 1]
    assert [name for day in days for name, _ in day] == [name for name, _ in items]
    assert schedule.pack_days([("too long", 500.0), ("short", 10.0)], 390) == [[("too long", 500.0)], [("short", 10.0)]]


def test_the_instructors_jobs_use_a_measured_make_test_and_scale_the_gradebook(tmp_path, monkeypatch):
    monkeypatch.setattr(schedule, "GRADEBOOK_SECONDS", {e: 60.0 for e in schedule.CORE_EXERCISES})
    times = tmp_path / "test-times.json"
    times.write_text('{"total_seconds": 1140.0}')
    lines = "\n".join(schedule.preparation(30, times))
    assert "make test: 19 min (measured here" in lines
    assert "180 s per attendee for the core day's exercises" in lines and "for 30 attendees 90 min" in lines
    monkeypatch.setattr(schedule, "GRADEBOOK_SECONDS", {})
    monkeypatch.setattr(schedule, "MAKE_TEST_MINUTES", None)
    lines = "\n".join(schedule.preparation(30, tmp_path / "missing.json"))
    assert "make test: not measured yet" in lines and "make gradebook: not measured yet" in lines


def test_the_command_line_refuses_a_factor_that_makes_no_sense(capsys):
    for bad in (["--live-factor", "0"], ["--setup-minutes", "-5"], ["--attendees", "0"]):
        with pytest.raises(SystemExit):
            schedule.main(bad)
        assert "must be positive" in capsys.readouterr().err

def test_cells_whose_input_is_hidden_are_not_counted_as_read(tmp_path):
    notebook = tmp_path / "hidden.md"
    notebook.write_text(
        "# Hidden\n\n```{code-cell} ipython3\nx = 1\n```\n\n"
        "```{code-cell} ipython3\n---\njupyter:\n  source_hidden: true\ntags: [remove-input]\n---\nfigures(x=x)\n```\n\n"
        "```{code-cell} ipython3\n:tags: [remove-input]\n\nfigures(y=x)\n```\n\n"
        "```{code-cell} ipython3\n:tags: [hide-output]\n\nprint(x)\n```\n"
    )
    assert schedule.count_notebook(notebook).code_cells == 2



# ------------------------------------------------------------------ named tracks


def test_every_cut_of_the_instructor_guide_names_one_section_of_its_chapter():
    from packlab.course.schedule import tracks

    cuts = tracks.cut_lists(ROOT)
    numbers = [schedule.chapter_number(c) for c in schedule.toc_chapters(ROOT)]
    assert sorted(cuts) == numbers, "every chapter has a 'Cut when late:' list in instructor.md"
    assert all(cuts[n] for n in numbers)
    assert [s.title for s in cuts[3]] == ["The same bug elsewhere, and the same class of bug", "Put a lock around the read"]


def test_a_cut_that_names_no_section_or_two_is_refused(tmp_path):
    from packlab.course.schedule import tracks

    guide = "## Chapter by chapter\n\n- **Chapter 5, x.** Cut when late: \"Shards\" and \"Nowhere\" (show \"Ignored\").\n"
    assert tracks.cut_titles(guide) == {5: ["Shards", "Nowhere"]}
    chapter = tmp_path / "05_x.md"
    chapter.write_text("# 5\n\n## Shards on disk\n\nwords\n\n## Shards in memory\n\nwords\n")
    with pytest.raises(tracks.CutListError, match="2 headings"):
        tracks.resolve(["Shards"], chapter)
    with pytest.raises(tracks.CutListError, match="no heading"):
        tracks.resolve(["Nowhere"], chapter)
    assert [s.title for s in tracks.resolve(["Shards on"], chapter)] == ["Shards on disk"]


def _measured_rows():
    seconds = {f"chapters/{Path(c).name}": 60.0 for c in schedule.toc_chapters(ROOT)}
    return schedule.sessions(ROOT, seconds, schedule.check_parts()), seconds


def test_the_two_day_track_teaches_exercise_4a_and_fits_two_days():
    from packlab.course.schedule import tracks

    rows, seconds = _measured_rows()
    days = tracks.plan(tracks.TRACKS["2"], rows, ROOT, seconds, factor=1.5)
    assert len(days) == 2
    labels = [p.label for p in days[1]]
    assert labels[:2] == ["chapter 5 (05_tar_shards), cut down", "exercise 04a_tarfile_reader"]
    assert all(sum(p.minutes for p in day) + (schedule.SETUP_MINUTES if n == 0 else 0) <= schedule.TEACHING_MINUTES_PER_DAY
               for n, day in enumerate(days)), [sum(p.minutes for p in d) for d in days]
    chapter5 = next(r for r in rows if r.number == 5)
    cut5 = days[1][0]
    assert len(cut5.cuts) == 3 and cut5.minutes < chapter5.live_chapter_min(1.5)
    # 4a (tarfile) is the hour the room has; 4b (the parser, the shuffles) is optional, and much longer.
    estimates = schedule.exercise_estimates(rows)
    assert days[1][1].minutes == pytest.approx(estimates["04a_tarfile_reader"] * 1.5)
    assert estimates["04_tar_shards"] > 1.5 * estimates["04a_tarfile_reader"]
    assert "04_tar_shards" in tracks.TRACKS["2"].optional


def test_the_tracks_cover_their_chapters_and_the_four_day_track_every_chapter():
    from packlab.course.schedule import tracks

    rows, seconds = _measured_rows()
    numbers = {r.number for r in rows}
    for name, track in tracks.TRACKS.items():
        days = tracks.plan(track, rows, ROOT, seconds, factor=1.5)
        taught = {int(p.label.split()[1]) for day in days for p in day if p.label.startswith("chapter")}
        assert taught | set(track.reading) >= numbers - {2} if name == "1-shards" else taught | set(track.reading) == numbers, name
    four = tracks.plan(tracks.TRACKS["4"], rows, ROOT, seconds, factor=1.5)
    assert len(four) <= 4 + 1
    assert "exercise 12_interleaved_shuffle" in [p.label for day in four for p in day]


def test_track_2_on_the_command_line_prints_a_two_day_plan(tmp_path, capsys):
    nbformat = pytest.importorskip("nbformat")
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(tmp_path / "cache"))
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("a = 1")])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cache.cache_notebook_bundle(CacheBundleIn(notebook, str(ROOT / "chapters/05_tar_shards.md"),
                                              data={"execution_seconds": 90.0}), check_validity=False)
    assert schedule.main(["--cache", str(tmp_path / "cache"), "--track", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Track 2: two days") and "\nDay 1 (" in out and "\nDay 2 (" in out and "\nDay 3" not in out
    assert "9:00-9:30 introductions and set-up" in out and "exercise 04a_tarfile_reader" in out
    assert 'chapter 5 (05_tar_shards): "How big a buffer?"' in out and "For reading afterwards: chapter 8" in out
