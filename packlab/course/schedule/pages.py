"""The schedule as the book shows it: MyST for the ``{course-schedule}`` directive (:mod:`packlab.course.book`).

The guide's and the introduction's timetables are never typed: the book computes them
when it builds, from the same model and the same execution cache as
``python -m packlab.course.schedule``. What a page asks for, it names:

* ``{course-schedule} summary``: one paragraph, how long the course takes read alone
  and taught live, and on how many days each named track fits;
* ``{course-schedule} table``: the session table (words, cells, boxes, reading, running,
  exercise, live), with each chapter's episodes and its longest;
* ``{course-schedule} track 2``: a named track's days as timetables, its cuts, what it
  leaves for reading and which exercises are optional.

Each function returns MyST text (a list of lines) that the directive parses in place;
chapter names become ``{doc}`` links, so the page links to what it schedules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packlab import paths
from packlab.course import schedule
from packlab.course.schedule import counting, tracks


@dataclass(frozen=True)
class Inputs:
    """What every page of the schedule is computed from: the sessions, the measured seconds, the live factor."""

    root: Path
    rows: list
    seconds: dict
    factor: float = schedule.LIVE_TEACHING_FACTOR
    setup_minutes: float = schedule.SETUP_MINUTES


def load(root: Path, cache_dir: Path) -> Inputs:
    """The sessions of the book at ``root`` with the running times of the cache at ``cache_dir`` (none: 0 min, said)."""
    try:
        seconds = schedule.execution_seconds(cache_dir)
    except schedule.MissingCacheError:
        seconds = {}
    return Inputs(root, schedule.sessions(root, seconds, schedule.check_parts()), seconds)


def _linked(label: str) -> str:
    """``chapter 5 (05_tar_shards), cut down`` -> a ``{doc}`` link to the chapter with the rest of the label."""
    chapter = re.match(r"chapter (\d+) \((\w+)\)(.*)", label)
    if chapter:
        return f"chapter {{doc}}`{chapter.group(1)} <chapters/{chapter.group(2)}>`{chapter.group(3).replace('-', '–')}"
    exercise = re.match(r"exercise (\w+)(.*)", label)
    if exercise:
        return f"exercise {{doc}}`{exercise_number(exercise.group(1))} <exercises/{exercise.group(1)}>`{exercise.group(2)}"
    return label


def exercise_number(notebook: str) -> str:
    """What the exercise calls itself in its title ("# Exercise 4a. ..." -> "4a"), else its number."""
    path = paths.repo_root() / "exercises" / f"{notebook}.md"
    if path.is_file():
        title = re.search(r"^# Exercise (\w+)\.", path.read_text(encoding="utf-8"), re.M)
        if title:
            return title.group(1)
    return notebook[:2].lstrip("0")


def _clock_rows(items: list[tuple[str, float]]) -> list[str]:
    """A day's timetable (breaks placed as :func:`packlab.course.schedule.timetable` places them) as table rows."""
    out = []
    for line in schedule.timetable(items):
        span, what = line.split(" ", 1)
        what = re.sub(r"\(make doctor on every machine\)", "(`make doctor` on every machine)", what)
        continued = what.endswith(" (continued)")
        base = what[: -len(" (continued)")] if continued else what
        shown = _linked(base) + (" (continued)" if continued else "")
        if base in ("coffee", "lunch"):
            shown = f"*{base}*"
        start, end = span.split("-")
        minutes = schedule._clock_minutes(end) - schedule._clock_minutes(start)
        out.append(f"| {span.replace('-', '–')} | {shown} | {minutes} |")
    return out


def track(inputs: Inputs, name: str) -> list[str]:
    """A named track's days as tables, then its cuts, its reading and its optional exercises."""
    chosen = tracks.TRACKS[name]
    days = tracks.plan(chosen, inputs.rows, inputs.root, inputs.seconds, inputs.factor)
    out = [f"**Track `{name}`**, {chosen.title}:", ""]
    for number, day in enumerate(days, start=1):
        items = [(p.label, p.minutes) for p in day]
        if number == 1 and inputs.setup_minutes:
            items.insert(0, (schedule.SETUP_ITEM, float(inputs.setup_minutes)))
        minutes = sum(m for _, m in items)
        verdict = "fits" if minutes <= schedule.TEACHING_MINUTES_PER_DAY else "does **not** fit"
        out += [f"*Day {number}*: {schedule._hours(minutes)} of teaching; it {verdict} the "
                f"{schedule._hours(schedule.TEACHING_MINUTES_PER_DAY)} of a day.", "",
                "| Time | Item | Minutes |", "| --- | --- | ---: |", *_clock_rows(items), ""]
    cut = [(p.label, title, saved) for day in days for p in day for title, saved in p.cuts]
    if cut:
        shown = "; ".join(f"{_linked(label.split(',')[0])}: “{title.replace('`', '')}”" for label, title, _ in cut)
        out += [f"Shown from the book instead of taught (the guide's cuts, {tracks.SHOW_MINUTES:g} min each): {shown}.", ""]
    if chosen.reading:
        out += ["For reading afterwards: chapters " + ", ".join(str(n) for n in chosen.reading) + ".", ""]
    exercises = schedule.exercise_estimates(inputs.rows)
    optional = [f"{_linked('exercise ' + e)} (about {schedule._minutes(exercises[e] * inputs.factor)} min)"
                for e in chosen.optional if e in exercises]
    if optional:
        out += [f"Optional, for whoever is ahead or for home: {', '.join(optional)}.", ""]
    return out + _missing(inputs)


def _missing(inputs: Inputs) -> list[str]:
    missing = [Path(r.chapter).name for r in inputs.rows if r.run_min is None]
    if not missing:
        return []
    return [f"No measured run in this build's execution cache for {', '.join(missing)}: counted as 0 min.", ""]


def longest_episodes(inputs: Inputs) -> dict[int, tuple[int, float]]:
    """``{chapter: (episodes, minutes of its longest episode, live)}``."""
    out = {}
    for row in inputs.rows:
        found = counting.episodes((inputs.root / f"{row.chapter}.md").read_text(encoding="utf-8"))
        minutes = [schedule.episode_minutes(e, row.run_min, row.all_cells, inputs.factor) for e in found]
        out[row.number] = (len(found), max(minutes, default=0.0))
    return out


def table(inputs: Inputs) -> list[str]:
    """The session table: one row per chapter and its exercise, then the totals."""
    factor = inputs.factor
    episodes = longest_episodes(inputs)
    out = ["| Session | Chapter | Words | Code cells | Predict / Try it | Episodes (longest, min) | Read (min) | "
           f"Run (min) | Boxes (min) | Exercise | Exercise (min, est.) | Live ×{factor:g} (min) |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for row in inputs.rows:
        live = row.live_chapter_min(factor) + row.every_exercise_min * factor  # the extras too, as the total
        count, longest = episodes[row.number]
        exercise = "none" if row.exercise is None else _linked(f"exercise {row.exercise}")
        exercise += "".join(f", then {_linked(f'exercise {extra}')} ({schedule._minutes(minutes)})"
                            for extra, minutes in row.extra_exercises)
        out.append(f"| {row.number} | {{doc}}`{Path(row.chapter).name} <{row.chapter}>` | {row.words:,} | "
                   f"{row.code_cells} | {row.predicts} / {row.try_its} | {count} ({schedule._minutes(longest)}) | "
                   f"{schedule._minutes(row.read_min)} | {schedule._minutes(row.run_min)} | "
                   f"{schedule._minutes(row.activity_min)} | {exercise} | "
                   f"{'' if row.exercise is None else schedule._minutes(row.exercise_min)} | {schedule._minutes(live)} |")
    totals = _totals(inputs)
    out.append(f"| | **all** | {sum(r.words for r in inputs.rows):,} | {sum(r.code_cells for r in inputs.rows)} | "
               f"{sum(r.predicts for r in inputs.rows)} / {sum(r.try_its for r in inputs.rows)} | "
               f"{sum(c for c, _ in episodes.values())} | {schedule._minutes(totals['read'])} | "
               f"{schedule._minutes(totals['run'])} | {schedule._minutes(totals['boxes'])} | | "
               f"{schedule._minutes(totals['exercises'])} | {schedule._minutes(totals['live'])} "
               f"({schedule._hours(totals['live'])}) |")
    return out + [""] + _missing(inputs)


def _totals(inputs: Inputs) -> dict[str, float]:
    rows, factor = inputs.rows, inputs.factor
    read = sum(r.read_min for r in rows)
    run = sum(r.run_min or 0.0 for r in rows)
    boxes = sum(r.activity_min for r in rows)
    exercises = sum(r.every_exercise_min for r in rows)
    return {"read": read, "run": run, "boxes": boxes, "exercises": exercises,
            "alone": read + run + boxes, "everything": read + run + boxes + exercises,
            "live": (read + exercises) * factor + run + boxes}


def summary(inputs: Inputs) -> list[str]:
    """One paragraph: the course read alone and taught live, and each named track's days."""
    totals = _totals(inputs)
    four_days = 4 * schedule.TEACHING_MINUTES_PER_DAY - inputs.setup_minutes
    days_of_teaching = (f"more than four days of {schedule._hours(schedule.TEACHING_MINUTES_PER_DAY)}: the tracks "
                        "choose what is taught and what is shown or left for reading"
                        if totals["live"] > four_days else
                        f"within four days of {schedule._hours(schedule.TEACHING_MINUTES_PER_DAY)}")
    fits = []
    for name, chosen in tracks.TRACKS.items():
        days = tracks.plan(chosen, inputs.rows, inputs.root, inputs.seconds, inputs.factor)
        over = [n for n, day in enumerate(days, start=1)
                if sum(p.minutes for p in day) + (inputs.setup_minutes if n == 1 else 0) > schedule.TEACHING_MINUTES_PER_DAY]
        fits.append(f"`{name}` in {len(days)} day{'s' if len(days) > 1 else ''}"
                    + (f" (day {', '.join(map(str, over))} over)" if over else ""))
    return [f"Read alone, the chapters take {schedule._hours(totals['alone'])} (their prose, code, measured runs and "
            f"{sum(r.predicts for r in inputs.rows)} Predicts and {sum(r.try_its for r in inputs.rows)} Try-its at "
            f"{schedule.MINUTES_PER_PREDICT:g} and {schedule.MINUTES_PER_TRY_IT:g} min each), and with every exercise "
            f"{schedule._hours(totals['everything'])}. Taught live (reading and exercises × {inputs.factor:g}), every "
            f"chapter and exercise together take {schedule._hours(totals['live'])}, {days_of_teaching}. Computed in this "
            f"build, the "
            f"tracks take: {'; '.join(fits)}.", ""] + _missing(inputs)


def render(inputs: Inputs, request: str) -> list[str]:
    """The MyST for one directive argument: ``summary``, ``table`` or ``track NAME``."""
    words = request.split()
    if words == ["summary"]:
        return summary(inputs)
    if words == ["table"]:
        return table(inputs)
    if len(words) == 2 and words[0] == "track" and words[1] in tracks.TRACKS:
        return track(inputs, words[1])
    raise ValueError(f"{{course-schedule}} {request!r}: say summary, table, or track and one of {', '.join(tracks.TRACKS)}")
