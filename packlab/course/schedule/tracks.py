"""Named tracks: the course as one, two or four days, computed with the instructor guide's cuts applied.

A track is a list of days; a day, a list of items: a chapter (whole, or with the
sections the instructor guide says to cut when late) or an exercise (whole, or its core
stage). Its minutes come from the same model as the full table (:func:`packlab.course.schedule.sessions`):

* a chapter's reading and running, less what its **cut sections** hold: their words and
  visible code cells, and their share of the chapter's measured running time (by their
  share of its code cells: the execution cache records whole notebooks, not cells); each
  cut section is *shown* from the built book instead, :data:`SHOW_MINUTES` of the
  instructor's time;
* an exercise's estimate, or for its **core stage** the lines of the solution outside
  the stretch methods and the parts of the core stage only
  (:data:`packlab.course.grading.teaching.STAGES` and ``STRETCH_CODE``).

The cut lists are read from ``instructor.md`` ("Chapter by chapter"), each chapter's
``Cut when late: "Section" and "Section" (show them)`` sentence: titles in quotes,
outside parentheses, each the start of one heading of that chapter (:func:`cut_lists`).
Edit the guide, and the tracks follow.

``python -m packlab.course.schedule --track 2`` prints a track's days as timetables, the
cuts it applied, and what is left for reading. The tracks (:data:`TRACKS`):

* ``1``: one day, the zip: chapters 0–4 with exercises 1 and 3, cuts applied;
* ``1-shards``: one day for those who came for WebDataset: chapters 0, 1, 3 and 4 cut
  down, then chapter 5 cut down and exercise 4a (shards read with ``tarfile``);
* ``2``: two days: day one as ``1``; day two chapters 5–7 cut down, exercise 4a and
  exercise 6; chapters 8–15 for reading;
* ``4``: four days: every chapter, every planned exercise, in order, a day ending between
  two episodes of a chapter where it must (:func:`pack_at_episodes`); the guide's cuts
  only where the days would not hold the course without them.

Exercise 4b (the hand-written tar parser, truncated shards, the shuffles) and exercise 8
(LMDB) are optional in every track: for whoever is ahead, or for home.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packlab.course.schedule import counting

#: Minutes an instructor spends showing a cut section from the built book instead of teaching it.
SHOW_MINUTES = 3.0
_BULLET = re.compile(r"^- \*\*Chapter (\d+)\b")
_CUT = re.compile(r"Cut when late[^:]*:\s*(.*?)\.(?=\s|$)", re.S)
_QUOTED = re.compile(r'"([^"]+)"')


class CutListError(ValueError):
    """A cut list that names no section, or two; the message names the chapter and the title."""


def cut_titles(guide_text: str) -> dict[int, list[str]]:
    """``{chapter number: [quoted titles]}`` from the guide's "Cut when late:" sentences (see the module docstring)."""
    section = guide_text.split("## Chapter by chapter", 1)[-1].split("\n## ", 1)[0]
    bullets: dict[int, str] = {}
    current = None
    for line in section.splitlines():
        found = _BULLET.match(line)
        if found:
            current = int(found.group(1))
            bullets[current] = line
        elif current is not None and line.startswith("  "):
            bullets[current] += " " + line.strip()
        elif not line.strip():
            current = None
    out = {}
    for number, text in bullets.items():
        match = _CUT.search(text)
        if match:
            clause = re.sub(r"\([^)]*\)", "", match.group(1))
            out[number] = _QUOTED.findall(clause)
    return out


def resolve(titles: list[str], chapter: Path) -> list[counting.Section]:
    """The chapter's sections whose headings start with each title (exactly one each), or a :class:`CutListError`."""
    found = counting.sections(chapter.read_text(encoding="utf-8"))
    out = []
    for title in titles:
        matches = [s for s in found if counting.normalise_title(s.title).startswith(counting.normalise_title(title))]
        if len(matches) != 1:
            raise CutListError(f"instructor.md cuts {title!r} from {chapter.name}, which has "
                               f"{len(matches) or 'no'} heading{'s' if len(matches) != 1 else ''} starting so: "
                               "name one section of the chapter by the start of its heading")
        out.append(matches[0])
    return out


def cut_lists(root: Path) -> dict[int, list[counting.Section]]:
    """``{chapter number: [sections to cut when late]}`` from the guide at ``root/instructor.md``."""
    guide = root / "instructor.md"
    if not guide.is_file():
        return {}
    chapters = {int(p.name.split("_", 1)[0]): p for p in (root / "chapters").glob("[0-9]*.md")}
    return {number: resolve(titles, chapters[number])
            for number, titles in cut_titles(guide.read_text(encoding="utf-8")).items() if number in chapters}


# ---------------------------------------------------------------------------- tracks


@dataclass(frozen=True)
class Item:
    """A chapter (``kind="chapter"``, its number; ``cut``: with the guide's cuts) or an exercise (its notebook; ``stage``)."""

    kind: str
    name: int | str
    cut: bool = False
    stage: str | None = None


def chapter(number: int, cut: bool = True) -> Item:
    return Item("chapter", number, cut=cut)


def exercise(notebook: str, stage: str | None = None) -> Item:
    return Item("exercise", notebook, stage=stage)


@dataclass(frozen=True)
class Track:
    """A named format of the workshop: its days, what is left for reading, the optional exercises."""

    name: str
    title: str
    days: tuple[tuple[Item, ...], ...]
    reading: tuple[int, ...] = ()
    optional: tuple[str, ...] = ()
    #: Pack every chapter and planned exercise into as many days as they take (the four-day track).
    packed: bool = False


_DAY_ONE = (chapter(0), chapter(1), exercise("01_jpeg_dataset"), chapter(2), chapter(3), chapter(4),
            exercise("03_per_worker_zip"))
TRACKS: dict[str, Track] = {
    "1": Track("1", "one day: one file per sample, the zip, its pitfall and the fix", (_DAY_ONE,),
               reading=(5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), optional=("02_zip_packing",)),
    # The pitfall (chapter 3) stays: a tar reader opens its shards in the workers for the same reason.
    "1-shards": Track("1-shards", "one day for WebDataset: from one file per sample to tar shards read by workers",
                      ((chapter(0), chapter(1), chapter(3), chapter(4), chapter(5), exercise("04a_tarfile_reader")),),
                      reading=(2, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                      optional=("01_jpeg_dataset", "03_per_worker_zip", "04_tar_shards")),
    "2": Track("2", "two days: the zip day, then tar shards, ranks and how fast is enough",
               (_DAY_ONE, (chapter(5), exercise("04a_tarfile_reader"), chapter(6), chapter(7), exercise("06_bottleneck"))),
               reading=(8, 9, 10, 11, 12, 13, 14, 15),
               optional=("02_zip_packing", "04_tar_shards", "05_shard_split")),
    "4": Track("4", "four days: every chapter, the exercises in order", (), packed=True,
               optional=("02_zip_packing", "04_tar_shards", "05_shard_split", "08_lmdb", "10_fast_path")),
}
#: The exercises of the four-day track (the others are optional there).
FOUR_DAY_EXERCISES = ("01_jpeg_dataset", "03_per_worker_zip", "04a_tarfile_reader", "06_bottleneck", "07_parallel_map",
                      "09_resuming_shards", "11_resumable_reader", "12_interleaved_shuffle")


@dataclass(frozen=True)
class Planned:
    """One item of a track with its live minutes, and what its cuts saved (chapters with cuts)."""

    label: str
    minutes: float
    cuts: tuple[tuple[str, float], ...] = ()
    #: A chapter's episodes (:func:`packlab.course.schedule.counting.episodes`), their minutes scaled
    #: to add up to ``minutes``: where a packed track may end a day inside the chapter.
    episodes: tuple[float, ...] = ()
    #: The number of the chapter's first episode in this item (1 unless a day ended inside it).
    first_episode: int = 1


def chapter_minutes(row, cuts: list[counting.Section], factor: float) -> tuple[float, tuple[tuple[str, float], ...]]:
    """A chapter taught live with ``cuts`` shown instead of taught: its minutes, and each cut's saving."""
    from packlab.course import schedule

    total = row.live_chapter_min(factor)
    saved = []
    all_cells = max(1, row.all_cells)
    for section in cuts:
        reading = schedule.reading_minutes(counting.NotebookText(section.words, section.code_cells)) * factor
        running = (row.run_min or 0.0) * section.all_cells / all_cells
        boxes = schedule.activity_minutes(section.predicts, section.try_its)
        saved.append((section.title, max(0.0, reading + running + boxes - SHOW_MINUTES)))  # a short one saves nothing
    return total - sum(s for _, s in saved), tuple(saved)


def exercise_core_minutes(root: Path, notebook: str, run_seconds: float | None) -> float:
    """The reading-model minutes of an exercise's core stage: all its prose, the core's lines and parts."""
    from packlab.course import schedule
    from packlab.course.grading import list_checks, teaching

    text = counting.count_notebook(root / "exercises" / f"{notebook}.md")
    lines = counting.solution_lines(root / "solutions" / f"{notebook}.md", teaching.STRETCH_CODE.get(notebook, ()))
    parts = 0
    for info in list_checks():
        if info.notebook == notebook:
            parts += len(teaching.stage_parts(info.id, "core") or info.parts)
    return schedule.exercise_minutes(text.words, lines, parts, run_seconds)


def plan_item(item: Item, rows: dict, root: Path, seconds: dict, factor: float, cuts: dict) -> Planned:
    """One item's live minutes (see the module docstring)."""
    from packlab.course import schedule

    if item.kind == "chapter":
        row = rows[item.name]
        minutes, saved = chapter_minutes(row, cuts.get(item.name, []) if item.cut else [], factor)
        label = f"chapter {item.name} ({Path(row.chapter).name})" + (", cut down" if saved else "")
        return Planned(label, minutes, saved, _episode_shares(root / f"{row.chapter}.md", row, minutes, factor))
    if item.stage == "core":
        minutes = exercise_core_minutes(root, item.name, seconds.get(f"solutions/{item.name}")) * factor
        return Planned(f"exercise {item.name}, core parts", minutes)
    return Planned(f"exercise {item.name}", schedule.exercise_estimates(list(rows.values()))[item.name] * factor)


def _episode_shares(path: Path, row, minutes: float, factor: float) -> tuple[float, ...]:
    """The chapter's episodes' live minutes, scaled to add up to ``minutes`` (its cuts spread over all of them)."""
    from packlab.course import schedule

    found = counting.episodes(path.read_text(encoding="utf-8"))
    raw = [schedule.episode_minutes(e, row.run_min, row.all_cells, factor) for e in found]
    total = sum(raw)
    return tuple(m * minutes / total for m in raw) if total > 0 else ()


def _episode_range(first: int, last: int) -> str:
    return f"episode {first}" if first == last else f"episodes {first}-{last}"


def pack_at_episodes(planned: list[Planned], first_day_reserved: float,
                     minutes_per_day: float | None = None) -> list[list[Planned]]:
    """``planned`` in order, cut into days; a day may end between two episodes of a chapter.

    A chapter that does not fit what is left of a day gives the day as many of its
    episodes as fit (when at least one does) and continues the next morning. Exercises
    are not split here (the timetable continues them across a break, as it does in a day).
    """
    from packlab.course import schedule

    limit = schedule.TEACHING_MINUTES_PER_DAY if minutes_per_day is None else minutes_per_day
    days: list[list[Planned]] = [[]]
    used = first_day_reserved
    queue = list(planned)
    while queue:
        item = queue.pop(0)
        if used + item.minutes <= limit or (not days[-1] and used == 0):
            days[-1].append(item)
            used += item.minutes
            continue
        fits, total = 0, 0.0
        for minutes in item.episodes[:-1]:  # the whole chapter did not fit: at most all but its last episode
            if used + total + minutes > limit:
                break
            fits, total = fits + 1, total + minutes
        if fits:
            last = item.first_episode + fits - 1
            days[-1].append(Planned(f"{item.label}, {_episode_range(item.first_episode, last)}", total, item.cuts,
                                    item.episodes[:fits], item.first_episode))
            rest = item.episodes[fits:]
            queue.insert(0, Planned(item.label, item.minutes - total, (), rest, last + 1))
        else:
            queue.insert(0, item)
        days.append([])
        used = 0.0
    for day in days:  # a continued chapter says which episodes it holds
        for n, item in enumerate(day):
            if item.first_episode > 1 and ", episode" not in item.label:
                last = item.first_episode + len(item.episodes) - 1
                day[n] = Planned(f"{item.label}, {_episode_range(item.first_episode, last)}", item.minutes, item.cuts,
                                 item.episodes, item.first_episode)
    return [day for day in days if day]


def plan(track: Track, rows: list, root: Path, seconds: dict, factor: float) -> list[list[Planned]]:
    """The track's days, each a list of :class:`Planned` items (the four-day track packed from every session)."""
    from packlab.course import schedule

    by_number = {r.number: r for r in rows}
    cuts = cut_lists(root)
    if not track.packed:
        return [[plan_item(item, by_number, root, seconds, factor, cuts) for item in day] for day in track.days]
    items = []
    for row in rows:
        items.append(chapter(row.number, cut=False))
        for name in (row.exercise, *(extra for extra, _ in row.extra_exercises)):
            if name in FOUR_DAY_EXERCISES:
                items.append(exercise(name))

    def packed(with_cuts: bool) -> list[list[Planned]]:
        planned = [plan_item(Item(i.kind, i.name, cut=with_cuts, stage=i.stage), by_number, root, seconds, factor, cuts)
                   for i in items]
        # Day one opens with the set-up slot: the days are cut with its minutes reserved.
        return pack_at_episodes(planned, float(schedule.SETUP_MINUTES))

    days = packed(with_cuts=False)
    return days if len(days) <= 4 else packed(with_cuts=True)  # the guide's cuts, where four days do not hold it


SETUP = "set-up"


def report(name: str, rows: list, root: Path, seconds: dict, factor: float, setup_minutes: float) -> str:
    """The track as text: each day's timetable and whether it fits, the cuts applied, what is left for reading."""
    from packlab.course import schedule

    track = TRACKS[name]
    days = plan(track, rows, root, seconds, factor)
    out = [f"Track {track.name}: {track.title}.",
           f"Taught live: reading and exercises × {factor:g}, running as measured; the first day starts with "
           f"{setup_minutes:g} min of introductions and set-up; a cut section is shown from the built book "
           f"({SHOW_MINUTES:g} min) instead of taught."]
    for number, day in enumerate(days, start=1):
        items = [(p.label, p.minutes) for p in day]
        if number == 1 and setup_minutes:
            items.insert(0, (schedule.SETUP_ITEM, float(setup_minutes)))
        minutes = sum(m for _, m in items)
        verdict = "fits" if minutes <= schedule.TEACHING_MINUTES_PER_DAY else "does NOT fit"
        out += ["", f"Day {number} ({schedule._hours(minutes)} of teaching; it {verdict} the "
                    f"{schedule._hours(schedule.TEACHING_MINUTES_PER_DAY)} of a day):", *schedule.timetable(items)]
    cut = [(p.label, title, saved) for day in days for p in day for title, saved in p.cuts]
    if cut:
        out += ["", "Cut when late, as the instructor guide says (each shown instead of taught):"]
        out += [f"- {label.split(',')[0]}: \"{title}\" " + (f"(saves {saved:.0f} min)" if saved >= 0.5 else
                                                            "(saves no time: showing it takes as long)")
                for label, title, saved in cut]
    if track.reading:
        out += ["", "For reading afterwards: " + ", ".join(f"chapter {n}" for n in track.reading) + "."]
    exercises = schedule.exercise_estimates(rows)
    optional = [f"{e} ({schedule._minutes(exercises[e] * factor)} min)" for e in track.optional if e in exercises]
    if optional:
        out += ["", f"Optional exercises (ahead of the room, or homework): {', '.join(optional)}."]
    missing = [Path(r.chapter).name for r in rows if r.run_min is None]
    if missing:
        out.append(f"No measured run in the cache for: {', '.join(missing)} (counted as 0 min).")
    return "\n".join(out)
