"""How long the course takes: a workshop schedule computed, not guessed.

A session of the workshop is one chapter and the exercise that follows it. Its length
has three parts, each computed from something anyone can look at:

* **reading**: the words of the chapter's prose (its markdown cells; code is not
  counted) at :data:`WORDS_PER_MINUTE`, a rate for technical prose read next to the code,
  tables and plots it talks about, plus :data:`MINUTES_PER_CODE_CELL` for each code cell
  (reading the code and what it printed);
* **running**: the seconds the chapter's cells took to execute, *measured*, from Jupyter
  Book's execution cache (``_build/.jupyter_cache``), which ``make test`` and
  ``make book`` fill; nothing here executes a notebook;
* **the exercise**: an *estimate* (no attendee was timed), from the exercise's prose
  (read at the same rate), the lines of its solution's graded blocks (the code the
  attendee writes, at :data:`MINUTES_PER_SOLUTION_LINE`), the parts of its checks (each
  one a behaviour to get right, at :data:`MINUTES_PER_CHECK_PART`) and the measured run
  of its solution notebook.

Reading is not teaching. A room taught live goes slower than one reader: the instructor
explains and types, questions come, and the room waits for most of its attendees, not
for the mean one. The plan therefore multiplies reading and exercise minutes by
:data:`LIVE_TEACHING_FACTOR` (1.5 by default, ``--live-factor``; 1 gives the reading
model), keeps the measured running time as it is, and starts the first day with
:data:`SETUP_MINUTES` for introductions and set-up (``make doctor`` on every machine;
``--setup-minutes``).

``python -m packlab.course.schedule`` prints the table in Markdown, then the course's two
halves (:data:`CORE_CHAPTERS` and :data:`CORE_EXERCISES`, then the rest) with clock times,
and says whether each fits the teaching time of a day; where one does not, it also packs
the same sessions into as many days as they need. ``--track 1|1-shards|2|4`` prints a
named track instead, with the instructor guide's cuts applied
(:mod:`packlab.course.schedule.tracks`). Last it says how long an instructor's own
jobs take: ``make test`` and ``make book`` before the day, and ``make gradebook`` for
``--attendees N`` after it (:func:`preparation`). ``--cache PATH`` reads another
checkout's cache, e.g. that of the machine that ran ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from packlab import paths
from packlab.course.schedule.counting import (  # noqa: F401 - part of this module's interface
    NotebookText,
    count_notebook,
    input_hidden,
    prose_words,
    solution_lines,
    split_myst,
)

#: Reading rate for the chapters' prose, in words per minute. Silent reading of ordinary
#: non-fiction averages about 240 words/min; prose that sends the reader to a code cell, a
#: table or a plot every few sentences goes at about half that.
WORDS_PER_MINUTE = 120
#: Estimated minutes to write, run and correct one line of an exercise's solution.
MINUTES_PER_SOLUTION_LINE = 1.0
#: Estimated minutes per part of an exercise's checks: run it, read the report, fix one thing.
MINUTES_PER_CHECK_PART = 1.0
#: Minutes to read one code cell and look at what it printed or plotted (the words of the
#: rate above are prose only; a chapter with twice the cells takes longer to follow).
MINUTES_PER_CODE_CELL = 0.5

#: Minutes the room spends on one Predict box: read the question, commit to an answer, run
#: the cell that answers it and say why it came out so. Counted as room time, not multiplied.
MINUTES_PER_PREDICT = 3.0
#: Minutes the room spends on one Try-it box: change a cell, run it, look at what changed.
MINUTES_PER_TRY_IT = 5.0

#: The longest a taught episode may be, live (see :func:`episode_minutes`), and the most
#: words of prose one may hold: past either, split it with a hands-on or move part of it
#: to a "Going further" section that the tracks cut.
EPISODE_MAX_MINUTES = 40
EPISODE_MAX_WORDS = 2000

#: Live teaching against reading alone (see the module docstring): reading and exercise
#: minutes are multiplied by this; 1.5 is a common rule of thumb for hands-on workshops
#: (an estimate, like the rates above: time your own room and change it).
LIVE_TEACHING_FACTOR = 1.5
#: Minutes for introductions and set-up at the start of the first day: every attendee runs
#: ``make doctor`` and opens chapter 0, and a helper fixes what it marks ✗.
SETUP_MINUTES = 30

#: Instructor's jobs, measured on a 2-core machine (see instructor.md). ``make test``
#: (when ``_build/test-times.json`` is there, its measured total is used instead) and
#: ``make book`` after it (the book reuses nbval's runs). None: not measured yet.
MAKE_TEST_MINUTES: float | None = 43.2  # a clean clone, all 15 chapters, 2 cores, 29 November 2026 (2,590 s)
MAKE_BOOK_AFTER_TEST_MINUTES: float | None = 0.25  # `make book` right after it: 15 s, nothing executed
#: Seconds ``make gradebook`` takes per attendee and exercise notebook: the solution
#: notebook graded in a fresh kernel (``grade.grade_class`` on a class of one), on a
#: 2-core machine with nothing else running, 26 November 2026. Each run also wrote the
#: checks' fixture archives, which later attendees find cached: an upper bound.
GRADEBOOK_SECONDS: dict[str, float] = {
    "01_jpeg_dataset": 17.3,
    "02_zip_packing": 17.9,
    "03_per_worker_zip": 37.7,
    "04_tar_shards": 22.5,
    "05_shard_split": 13.2,
    "06_bottleneck": 43.6,
    "07_parallel_map": 8.4,
    "08_lmdb": 15.7,
    "09_resuming_shards": 34.6,
}

#: The workshop day: start, end, and the breaks (name, start, minutes), as clock minutes.
DAY_START = 9 * 60
DAY_END = 17 * 60
BREAKS = (("coffee", 10 * 60 + 30, 15), ("lunch", 12 * 60 + 30, 60), ("coffee", 15 * 60, 15))
#: Minutes a break may move to fall between two items rather than split one.
BREAK_SLACK = 15
#: Teaching time in a day: 9:00-17:00 less the breaks, 6.5 h.
TEACHING_MINUTES_PER_DAY = DAY_END - DAY_START - sum(minutes for _, _, minutes in BREAKS)

#: The one-day core track: chapters (by number) and exercises (by notebook name) taught on
#: the first day: from one file per sample to multi-rank tar shards, writing the three
#: loaders the rest of the course builds on. ``python -m packlab.course.schedule`` says whether
#: it still fits :data:`TEACHING_MINUTES_PER_DAY`.
CORE_CHAPTERS = (0, 1, 2, 3, 4, 5, 6)
CORE_EXERCISES = ("01_jpeg_dataset", "03_per_worker_zip", "04a_tarfile_reader")
#: The second day: the other chapters (performance, and beyond one machine) with their
#: exercises. Exercises in neither day are optional: for whoever is ahead, or homework.
SECOND_DAY_CHAPTERS = (7, 8, 9, 10, 11, 12, 13, 14, 15)
SECOND_DAY_EXERCISES = ("06_bottleneck", "07_parallel_map", "08_lmdb", "09_resuming_shards", "11_resumable_reader",
                        "12_interleaved_shuffle")

#: The book's execution cache, relative to the repository (shared by make test and make book).
CACHE_DIR = Path("_build") / ".jupyter_cache"

class MissingCacheError(RuntimeError):
    """No execution cache where one was expected; the message says how to make one."""


# --- The book's structure -------------------------------------------------------------


def toc_chapters(root: Path) -> list[str]:
    """The chapters of the book, in ``_toc.yml`` order (``chapters/NN_name``)."""
    return [f for f in _toc_files(root) if f.startswith("chapters/")]


def toc_exercises(root: Path) -> list[str]:
    """The exercise notebooks of the book, in ``_toc.yml`` order (``exercises/NN_name``)."""
    return [f for f in _toc_files(root) if f.startswith("exercises/") and f != "exercises/index"]


def _toc_files(root: Path) -> list[str]:
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files.extend(entry["file"] for entry in part.get("chapters", []))
    return [str(Path(f).with_suffix("")) for f in files]


def chapter_number(chapter: str) -> int:
    """``chapters/05_tar_shards`` -> 5."""
    return int(Path(chapter).name.split("_", 1)[0])


def exercises_by_chapter(root: Path) -> dict[int, list[str]]:
    """Which exercises follow which chapter, in the order of the table in ``exercises/index.md``.

    An exercise that follows two chapters ("3, 4") belongs to the session of the later one:
    it needs both. The first exercise of a chapter is its session's; the others (exercise
    4b after 4a) are extras, for the tracks that name them.
    """
    found: dict[int, list[str]] = {}
    row = re.compile(r"^\|\s*\{doc\}`([^`]+)`\s*\|.*\|\s*([\d,\s]+?)\s*\|\s*$")
    for line in (root / "exercises" / "index.md").read_text(encoding="utf-8").splitlines():
        match = row.match(line.strip())
        if match:
            last = max(int(n) for n in match.group(2).split(","))
            found.setdefault(last, []).append(Path(match.group(1)).name)
    return found


# --- Measured execution times ---------------------------------------------------------


def execution_seconds(cache_dir: Path) -> dict[str, float]:
    """Measured execution seconds per notebook (``chapters/NN_name``), from a jupyter-cache.

    Each record of the cache is one executed notebook: its ``uri`` is the source's path
    (absolute, on the machine that ran it), and ``data["execution_seconds"]`` is how long
    its cells took. A notebook executed more than once (its code changed in between) has
    several records; the newest one counts. Raises :class:`MissingCacheError` when there
    is no cache at ``cache_dir``.
    """
    cache_dir = Path(cache_dir)
    # jupyter_cache creates an empty cache where none exists: look before asking it.
    if not (cache_dir / "global.db").is_file():
        raise MissingCacheError(
            f"no execution cache at {cache_dir}: the running times are measured from it. "
            "Run `make test` or `make book` first (either executes every chapter and fills "
            "the cache), or point --cache at another checkout's _build/.jupyter_cache."
        )
    from jupyter_cache import get_cache

    newest: dict[str, tuple[int, float]] = {}
    for record in get_cache(str(cache_dir)).list_cache_records():
        seconds = (record.data or {}).get("execution_seconds")
        if seconds is None:
            continue
        uri = Path(record.uri)
        name = f"{uri.parent.name}/{uri.stem}"
        if name not in newest or record.pk > newest[name][0]:
            newest[name] = (record.pk, float(seconds))
    return {name: seconds for name, (_, seconds) in newest.items()}


def check_parts() -> dict[str, int]:
    """Parts of the graded checks per exercise notebook (``01_jpeg_dataset`` -> 9)."""
    from packlab.course.grading import list_checks

    parts: dict[str, int] = {}
    for info in list_checks():
        parts[info.notebook] = parts.get(info.notebook, 0) + len(info.parts)
    return parts


# --- The schedule ---------------------------------------------------------------------


@dataclass(frozen=True)
class Session:
    """One chapter and the exercise that follows it, with its minutes.

    ``run_min`` and ``exercise_min`` are ``None`` where no measurement was found.
    """

    chapter: str
    words: int
    code_cells: int
    read_min: float
    run_min: float | None
    exercise: str | None = None
    exercise_min: float | None = None
    #: Every code cell, hidden ones too (they run): a cut section's share of the running time.
    all_cells: int = 0
    #: The chapter's Predict and Try-it boxes (:func:`activity_minutes`).
    predicts: int = 0
    try_its: int = 0
    #: Further exercises after this chapter, ``(notebook, reading-model minutes)`` (exercise 4b after 4a).
    extra_exercises: tuple[tuple[str, float], ...] = ()

    @property
    def number(self) -> int:
        return chapter_number(self.chapter)

    @property
    def activity_min(self) -> float:
        return activity_minutes(self.predicts, self.try_its)

    @property
    def chapter_min(self) -> float:
        return self.read_min + (self.run_min or 0.0) + self.activity_min

    def live_chapter_min(self, factor: float = LIVE_TEACHING_FACTOR) -> float:
        """The chapter taught live: its reading at ``factor``, its running as measured, its Predicts and Try-its."""
        return self.read_min * factor + (self.run_min or 0.0) + self.activity_min

    def live_exercise_min(self, factor: float = LIVE_TEACHING_FACTOR) -> float | None:
        return None if self.exercise_min is None else self.exercise_min * factor

    @property
    def every_exercise_min(self) -> float:
        """The session's exercise and the extras after it, reading model."""
        return (self.exercise_min or 0.0) + sum(minutes for _, minutes in self.extra_exercises)


def exercise_estimates(rows: list[Session]) -> dict[str, float]:
    """``{notebook: reading-model minutes}`` of every exercise, the sessions' and the extras."""
    out = {}
    for row in rows:
        if row.exercise is not None and row.exercise_min is not None:
            out[row.exercise] = row.exercise_min
        out.update(dict(row.extra_exercises))
    return out


def reading_minutes(text: NotebookText) -> float:
    """Minutes to follow a chapter: its prose at :data:`WORDS_PER_MINUTE`, its cells at :data:`MINUTES_PER_CODE_CELL`."""
    return text.words / WORDS_PER_MINUTE + text.code_cells * MINUTES_PER_CODE_CELL


def activity_minutes(predicts: int, try_its: int) -> float:
    """The room's time for a chapter's boxes: :data:`MINUTES_PER_PREDICT` and :data:`MINUTES_PER_TRY_IT` each."""
    return predicts * MINUTES_PER_PREDICT + try_its * MINUTES_PER_TRY_IT


def episode_minutes(episode, chapter_run_min: float | None, chapter_cells: int,
                    factor: float = LIVE_TEACHING_FACTOR) -> float:
    """One episode taught live: its reading at ``factor``, its boxes, its share of the chapter's run (by cells)."""
    reading = reading_minutes(NotebookText(episode.words, episode.code_cells)) * factor
    running = (chapter_run_min or 0.0) * episode.all_cells / max(1, chapter_cells)
    return reading + running + activity_minutes(episode.predicts, episode.try_its)


def exercise_minutes(words: int, lines: int, parts: int, run_seconds: float | None) -> float:
    """The estimate for one exercise: read it, write its lines, pass its parts, run it."""
    return (
        words / WORDS_PER_MINUTE
        + lines * MINUTES_PER_SOLUTION_LINE
        + parts * MINUTES_PER_CHECK_PART
        + (run_seconds or 0.0) / 60
    )


def sessions(root: Path, seconds: dict[str, float], parts: dict[str, int]) -> list[Session]:
    """One :class:`Session` per chapter of ``_toc.yml``, in order.

    ``seconds`` maps ``chapters/NN_name`` and ``solutions/NN_name`` to measured execution
    seconds (:func:`execution_seconds`); ``parts`` maps an exercise's notebook name to
    the parts of its checks (:func:`check_parts`).
    """
    exercise_of = exercises_by_chapter(root)

    def estimate(exercise: str) -> float:
        exercise_text = count_notebook(root / "exercises" / f"{exercise}.md")
        return exercise_minutes(exercise_text.words, solution_lines(root / "solutions" / f"{exercise}.md"),
                                parts.get(exercise, 0), seconds.get(f"solutions/{exercise}"))

    rows = []
    for chapter in toc_chapters(root):
        text = count_notebook(root / f"{chapter}.md")
        run = seconds.get(chapter)
        following = exercise_of.get(chapter_number(chapter), [])
        exercise = following[0] if following else None
        rows.append(
            Session(
                chapter,
                text.words,
                text.code_cells,
                reading_minutes(text),
                None if run is None else run / 60,
                exercise,
                None if exercise is None else estimate(exercise),
                len(split_myst((root / f"{chapter}.md").read_text(encoding="utf-8"))[1]),
                text.predicts,
                text.try_its,
                tuple((extra, estimate(extra)) for extra in following[1:]),
            )
        )
    return rows


def _minutes(value: float | None) -> str:
    return "n/a" if value is None else f"{math.ceil(value)}"


def _hours(minutes: float) -> str:
    return f"{minutes / 60:.1f} h"


def markdown_table(rows: list[Session], factor: float = LIVE_TEACHING_FACTOR) -> str:
    """The schedule as a Markdown table, one row per session and a row of totals.

    ``Total`` is the reading model; ``Live`` the same session taught live (reading and
    exercise at ``factor``, running as measured).
    """
    lines = [
        "| Session | Chapter | Words | Code cells | Read (min) | Run (min) | Exercise | Exercise (min, est.) | Total (min) | "
        f"Live ×{factor:g} (min) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        exercise = "none" if row.exercise is None else ", ".join([row.exercise, *(e for e, _ in row.extra_exercises)])
        total = row.chapter_min + row.every_exercise_min
        live = row.live_chapter_min(factor) + row.every_exercise_min * factor
        lines.append(
            f"| {row.number} | {Path(row.chapter).name} | {row.words:,} | {row.code_cells} | "
            f"{_minutes(row.read_min)} | {_minutes(row.run_min)} | {exercise} | "
            f"{'' if row.exercise is None else _minutes(row.every_exercise_min)} | {_minutes(total)} | {_minutes(live)} |"
        )
    read = sum(r.read_min for r in rows)
    run = sum(r.run_min or 0.0 for r in rows)
    exercises = sum(r.every_exercise_min for r in rows)
    live = (read + exercises) * factor + run
    lines.append(
        f"| | **all** | {sum(r.words for r in rows):,} | {sum(r.code_cells for r in rows)} | "
        f"{_minutes(read)} | {_minutes(run)} | | {_minutes(exercises)} | "
        f"{_minutes(read + run + exercises)} ({_hours(read + run + exercises)}) | {_minutes(live)} ({_hours(live)}) |"
    )
    return "\n".join(lines)


SETUP_ITEM = "introductions and set-up (make doctor on every machine)"


def day_plan(rows: list[Session], chapters, exercises, factor: float = 1.0, setup_minutes: float = 0.0) -> list[tuple[str, float]]:
    """A day's items in order: the set-up slot if any, each of its chapters, then the chapter's exercise if the day has it.

    Reading and exercise minutes are multiplied by ``factor`` (1: the reading model).
    """
    items = [(SETUP_ITEM, float(setup_minutes))] if setup_minutes else []
    for row in rows:
        if row.number in chapters:
            items.append((f"chapter {row.number} ({Path(row.chapter).name})", row.live_chapter_min(factor)))
            if row.exercise in exercises:
                items.append((f"exercise {row.exercise}", row.live_exercise_min(factor) or 0.0))
    return items


def pack_days(items: list[tuple[str, float]], minutes_per_day: float = TEACHING_MINUTES_PER_DAY) -> list[list[tuple[str, float]]]:
    """``items`` in order, cut into days of at most ``minutes_per_day`` at item boundaries.

    An item longer than a whole day gets a day of its own (and overruns it).
    """
    days: list[list[tuple[str, float]]] = [[]]
    used = 0.0
    for name, minutes in items:
        if days[-1] and used + minutes > minutes_per_day:
            days.append([])
            used = 0.0
        days[-1].append((name, minutes))
        used += minutes
    return [day for day in days if day]


def timetable(items: list[tuple[str, float]]) -> list[str]:
    """Clock times for ``items`` from :data:`DAY_START`, with the :data:`BREAKS` inserted.

    A break moves to the end of the item it falls in when that item ends within
    :data:`BREAK_SLACK` minutes of it, or is taken before the item when the item would
    start no more than that before it; otherwise the item is split around the break.
    """
    clock, lines = float(DAY_START), []
    pending = list(BREAKS)

    def take_break():
        nonlocal clock
        break_name, _, length = pending.pop(0)
        lines.append(f"{_clock(clock)}-{_clock(clock + length)} {break_name}")
        clock += length

    for name, minutes in items:
        remaining, label = float(minutes), name
        while pending and clock + remaining > pending[0][1]:
            start = pending[0][1]
            if clock + remaining - start <= BREAK_SLACK:
                break  # ends soon after the break was due: finish it first
            if start - clock > BREAK_SLACK:
                lines.append(f"{_clock(clock)}-{_clock(start)} {label}")
                remaining -= start - clock
                clock, label = float(start), f"{name} (continued)"
            take_break()
        lines.append(f"{_clock(clock)}-{_clock(clock + remaining)} {label}")
        clock += remaining
        if pending and clock >= pending[0][1]:
            take_break()
    return lines


def _clock_minutes(clock: str) -> int:
    """``"9:45"`` -> 585, the inverse of :func:`_clock`."""
    hours, minutes = clock.split(":")
    return int(hours) * 60 + int(minutes)


def _clock(minutes: float) -> str:
    minutes = round(minutes)
    return f"{minutes // 60}:{minutes % 60:02d}"


def _day(title: str, items: list[tuple[str, float]], chapters, exercises) -> list[str]:
    minutes = sum(m for _, m in items)
    verdict = "fits" if minutes <= TEACHING_MINUTES_PER_DAY else "does NOT fit"
    return [
        "",
        f"{title} (chapters {', '.join(map(str, chapters))}; exercises {', '.join(exercises) or 'none'}): "
        f"{_minutes(minutes)} min ({_hours(minutes)}) of teaching; it {verdict} the "
        f"{_hours(TEACHING_MINUTES_PER_DAY)} of a {_clock(DAY_START)}-{_clock(DAY_END)} day with breaks.",
        "",
        *timetable(items),
    ]


def preparation(attendees: int, test_times: Path | None = None) -> list[str]:
    """How long the instructor's own jobs take: make test and make book before, make gradebook after.

    ``make test``: the measured total of ``test_times`` (``_build/test-times.json``) when
    given and there, else :data:`MAKE_TEST_MINUTES`; ``make gradebook``: ``attendees``
    times :data:`GRADEBOOK_SECONDS` of the planned exercises, and of all of them.
    """
    import json

    out = ["", "The instructor's jobs (2-core machine):"]
    test = MAKE_TEST_MINUTES
    source = "measured for this guide"
    if test_times is not None and test_times.is_file():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            test = float(json.loads(test_times.read_text())["total_seconds"]) / 60
            source = f"measured here, {test_times}"
    out.append(f"- make test: {'not measured yet' if test is None else f'{_minutes(test)} min ({source})'}")
    book = MAKE_BOOK_AFTER_TEST_MINUTES
    out.append(f"- make book right after make test (it reuses nbval's runs): {'not measured yet' if book is None else f'{_minutes(book)} min'}")
    planned = [e for e in CORE_EXERCISES + SECOND_DAY_EXERCISES if e in GRADEBOOK_SECONDS]
    if GRADEBOOK_SECONDS:
        core = sum(GRADEBOOK_SECONDS.get(e, 0.0) for e in CORE_EXERCISES)
        every = sum(GRADEBOOK_SECONDS.values())
        out.append(
            f"- make gradebook, one notebook after another: {core:.0f} s per attendee for the core day's exercises, "
            f"{every:.0f} s for all {len(GRADEBOOK_SECONDS)}; for {attendees} attendees "
            f"{_minutes(attendees * core / 60)} min and {_minutes(attendees * every / 60)} min"
            + ("" if len(planned) == len(CORE_EXERCISES + SECOND_DAY_EXERCISES) else " (some exercises not measured)")
        )
    else:
        out.append("- make gradebook: not measured yet")
    return out


def report(rows: list[Session], factor: float = LIVE_TEACHING_FACTOR, setup_minutes: float = SETUP_MINUTES,
           attendees: int = 20, test_times: Path | None = None) -> str:
    """The table, how it was computed, the two days against the teaching time of a day, and the instructor's jobs."""
    missing = [Path(r.chapter).name for r in rows if r.run_min is None]
    out = [markdown_table(rows, factor), ""]
    out.append(
        f"Reading at {WORDS_PER_MINUTE} words/min (markdown cells only) plus "
        f"{MINUTES_PER_CODE_CELL:g} min per code cell; running measured "
        f"from the execution cache; exercises estimated from their prose at the same rate, "
        f"{MINUTES_PER_SOLUTION_LINE:g} min per line of the solution's graded blocks, "
        f"{MINUTES_PER_CHECK_PART:g} min per part of their checks and the solution "
        f"notebook's measured run. Taught live: reading and exercises × {factor:g}, running as measured; "
        f"the first day starts with {setup_minutes:g} min of introductions and set-up."
    )
    if missing:
        out.append(f"No measured run in the cache for: {', '.join(missing)} (counted as 0 min).")
    day_one = day_plan(rows, CORE_CHAPTERS, CORE_EXERCISES, factor, setup_minutes)
    day_two = day_plan(rows, SECOND_DAY_CHAPTERS, SECOND_DAY_EXERCISES, factor)
    out += _day("Day one, the core track", day_one, CORE_CHAPTERS, CORE_EXERCISES)
    out += _day("Day two", day_two, SECOND_DAY_CHAPTERS, SECOND_DAY_EXERCISES)
    if sum(m for _, m in day_one) > TEACHING_MINUTES_PER_DAY or sum(m for _, m in day_two) > TEACHING_MINUTES_PER_DAY:
        days = pack_days(day_one + day_two)
        out += ["", f"At this pace the same sessions need {len(days)} days; cut at session boundaries:"]
        for number, day in enumerate(days, start=1):
            out += ["", f"Day {number} ({_hours(sum(m for _, m in day))}):", *timetable(day)]
    planned = set(CORE_EXERCISES) | set(SECOND_DAY_EXERCISES)
    optional = [(name, minutes) for name, minutes in exercise_estimates(rows).items() if name not in planned]
    if optional:
        listed = ", ".join(f"{name} ({_minutes(minutes)} min)" for name, minutes in optional)
        out += ["", f"Optional exercises (ahead of the room, or homework): {listed}."]
    unplanned = [Path(r.chapter).name for r in rows if r.number not in CORE_CHAPTERS + SECOND_DAY_CHAPTERS]
    if unplanned:
        out += ["", f"Chapters in neither day (add them to a day in packlab/course/schedule.py): {', '.join(unplanned)}."]
    out += preparation(attendees, test_times)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from packlab.course.schedule import tracks

    parser = argparse.ArgumentParser(
        prog="python -m packlab.course.schedule",
        description="Print the workshop schedule: reading, measured running and exercise time per chapter.",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=paths.repo_root() / CACHE_DIR,
        help="Jupyter Book's execution cache to read the running times from (default: %(default)s)",
    )
    parser.add_argument("--live-factor", type=float, default=LIVE_TEACHING_FACTOR,
                        help="reading and exercise minutes taught live are this many times the reading model's "
                             "(default %(default)s; 1 gives the reading model)")
    parser.add_argument("--setup-minutes", type=float, default=SETUP_MINUTES,
                        help="introductions and set-up at the start of day one (default %(default)s)")
    parser.add_argument("--attendees", type=int, default=20, help="class size for make gradebook's time (default %(default)s)")
    parser.add_argument("--track", choices=sorted(tracks.TRACKS), default=None,
                        help="print one named track instead: 1 (one day, the zip), 1-shards (one day, tar shards), "
                             "2 (two days), 4 (four days), with the instructor guide's cuts applied")
    args = parser.parse_args(argv)
    if args.live_factor <= 0 or args.setup_minutes < 0 or args.attendees < 1:
        parser.error("--live-factor must be positive, --setup-minutes not negative, --attendees at least 1")
    root = paths.repo_root()
    try:
        seconds = execution_seconds(args.cache)
    except MissingCacheError as error:
        print(f"packlab.course.schedule: {error}", file=sys.stderr)
        return 2
    rows = sessions(root, seconds, check_parts())
    if args.track:
        try:
            print(tracks.report(args.track, rows, root, seconds, args.live_factor, args.setup_minutes))
        except tracks.CutListError as error:
            print(f"packlab.course.schedule: {error}", file=sys.stderr)
            return 2
        return 0
    times = Path(args.cache).resolve().parent / "test-times.json"
    print(report(rows, args.live_factor, args.setup_minutes, args.attendees, times))
    print(f"\nNamed tracks, with the instructor guide's cuts applied: --track {' | '.join(tracks.TRACKS)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
