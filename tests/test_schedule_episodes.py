"""The room's time: Predicts and Try-its counted, chapters cut into episodes, every named track fitting its days."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from packlab import paths
from packlab.course import schedule
from packlab.course.schedule import counting, pages, tracks

ROOT = paths.repo_root()

CHAPTER = textwrap.dedent(
    """\
    ---
    jupytext:
      text_representation:
        format_name: myst
    ---

    # A chapter

    ## First

    Some prose here.

    ```{admonition} Predict
    :class: tip
    Which is faster?
    ```

    ```{code-cell} ipython3
    :tags: [remove-input]
    hidden = 1
    ```

    ```{code-cell} ipython3
    answer = 2
    ```

    ## Second

    More prose.

    ````{admonition} Try it
    Change the cell:
    ```python
    answer = 3
    ```
    ````

    ## Key points

    The end.

    ```{code-cell} ipython3
    mark = 3
    ```
    """
)


def test_predicts_and_try_its_are_counted_and_cost_the_room_time(tmp_path):
    path = tmp_path / "01_x.md"
    path.write_text(CHAPTER, encoding="utf-8")
    counted = counting.count_notebook(path)
    assert (counted.predicts, counted.try_its) == (1, 1)
    assert schedule.activity_minutes(1, 1) == schedule.MINUTES_PER_PREDICT + schedule.MINUTES_PER_TRY_IT == 8
    row = schedule.Session("chapters/01_x", counted.words, counted.code_cells, 10.0, 1.0,
                           predicts=counted.predicts, try_its=counted.try_its)
    # The boxes are room time: added as they are, not multiplied by the live factor.
    assert row.live_chapter_min(1.5) == pytest.approx(10.0 * 1.5 + 1.0 + 8)
    sections = {s.title: s for s in counting.sections(CHAPTER)}
    assert (sections["First"].predicts, sections["Second"].try_its, sections["Key points"].predicts) == (1, 1, 0)


def test_a_chapter_is_cut_into_episodes_at_its_hands_ons():
    found = counting.episodes(CHAPTER)
    # A Predict ends with the first *visible* cell after it (the hidden one does not answer it);
    # a Try-it ends with its box, even one that holds a fence of its own; the rest is the last episode.
    assert [e.ends_with for e in found] == ["predict", "try it", "end"]
    assert [e.title for e in found] == ["First", "Second", "Key points"]  # the first ## heading in each
    assert [(e.code_cells, e.all_cells) for e in found] == [(1, 2), (0, 0), (1, 1)]
    assert sum(e.words for e in found) == counting.prose_words(counting.split_myst(CHAPTER)[0])


def test_no_taught_episode_runs_over_its_budget():
    """Every episode of every chapter, live, by the model: at most 40 minutes and 2,000 words."""
    inputs = pages.load(ROOT, ROOT / schedule.CACHE_DIR)
    over = []
    for row in inputs.rows:
        for n, episode in enumerate(counting.episodes((ROOT / f"{row.chapter}.md").read_text(encoding="utf-8")), 1):
            minutes = schedule.episode_minutes(episode, row.run_min, row.all_cells)
            if minutes > schedule.EPISODE_MAX_MINUTES or episode.words > schedule.EPISODE_MAX_WORDS:
                over.append(f"{Path(row.chapter).name} episode {n} ({episode.title!r}): {minutes:.0f} min, "
                            f"{episode.words} words")
    assert not over, ("episodes over budget (split them with a Predict or a Try-it, or move what is not taught "
                      f"to a section the guide cuts): {over}")


def test_every_named_track_fits_its_days():
    """Tracks 1, 1-shards, 2 and 4, Predicts and Try-its counted, this checkout's measured runs where it has them."""
    inputs = pages.load(ROOT, ROOT / schedule.CACHE_DIR)
    if not inputs.seconds:  # no cache here: a minute per chapter and solution, about what they take on 2 cores
        seconds = {f"chapters/{Path(c).name}": 60.0 for c in schedule.toc_chapters(ROOT)}
        inputs = pages.Inputs(ROOT, schedule.sessions(ROOT, seconds, schedule.check_parts()), seconds)
    expected_days = {"1": 1, "1-shards": 1, "2": 2, "4": 4}
    assert set(expected_days) == set(tracks.TRACKS)
    for name, chosen in tracks.TRACKS.items():
        days = tracks.plan(chosen, inputs.rows, ROOT, inputs.seconds, inputs.factor)
        loads = [sum(p.minutes for p in day) + (schedule.SETUP_MINUTES if n == 0 else 0) for n, day in enumerate(days)]
        assert len(days) == expected_days[name], (name, [round(m) for m in loads])
        assert all(m <= schedule.TEACHING_MINUTES_PER_DAY for m in loads), (name, [round(m) for m in loads])


def test_a_day_may_end_between_two_episodes_and_loses_no_minute():
    planned = [tracks.Planned("chapter 1 (01_a)", 300.0, episodes=(100.0, 100.0, 100.0)),
               tracks.Planned("chapter 2 (02_b)", 200.0, episodes=(50.0, 150.0)),
               tracks.Planned("exercise 01_a", 80.0)]
    days = tracks.pack_at_episodes(planned, first_day_reserved=30.0, minutes_per_day=390.0)
    labels = [[p.label for p in day] for day in days]
    assert labels == [["chapter 1 (01_a)", "chapter 2 (02_b), episode 1"],
                      ["chapter 2 (02_b), episode 2", "exercise 01_a"]]
    assert sum(p.minutes for day in days for p in day) == pytest.approx(580.0)
    # A chapter with no episode that fits waits for the next day, whole.
    days = tracks.pack_at_episodes([tracks.Planned("chapter 1 (01_a)", 300.0, episodes=(300.0,)),
                                    tracks.Planned("chapter 2 (02_b)", 200.0, episodes=(200.0,))], 0.0, 390.0)
    assert [[p.label for p in day] for day in days] == [["chapter 1 (01_a)"], ["chapter 2 (02_b)"]]


def test_the_book_pages_render_every_request_and_refuse_an_unknown_one():
    seconds = {f"chapters/{Path(c).name}": 60.0 for c in schedule.toc_chapters(ROOT)}
    inputs = pages.Inputs(ROOT, schedule.sessions(ROOT, seconds, schedule.check_parts()), seconds)
    table = "\n".join(pages.render(inputs, "table"))
    for chapter in schedule.toc_chapters(ROOT):
        assert f"<{chapter}>`" in table, chapter
    two = "\n".join(pages.render(inputs, "track 2"))
    assert "*Day 1*" in two and "*Day 2*" in two and "*Day 3*" not in two
    assert "| 9:00–9:30 | introductions and set-up" in two and "*lunch*" in two
    assert "exercise {doc}`4a <exercises/04a_tarfile_reader>`" in two
    assert "{doc}`4b <exercises/04_tar_shards>`" in two  # optional in this track
    summary = "\n".join(pages.render(inputs, "summary"))
    assert "Predicts" in summary and "`4` in 4 days" in summary
    with pytest.raises(ValueError, match="track and one of"):
        pages.render(inputs, "track 3")
