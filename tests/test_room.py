"""The helpers' brief: printed from the checks, so it says what check() says, part by part."""

from __future__ import annotations

import pytest

from packlab.course import room
from packlab.course.grading import list_checks, teaching


def test_the_brief_names_every_part_with_its_nudge_and_hint_and_marks_the_stages():
    text = room.brief(["04_tar_shards"])
    checks = [c for c in list_checks() if c.notebook == "04_tar_shards"]
    for info in checks:
        for part in info.parts:
            assert f"- **{part}**" in text, part
    assert teaching.nudge("tar_dataset", "fork_3_workers", "") in text
    assert "- **spawn_2_workers** (core):" in text and "- **bounded_buffer** (stretch):" in text
    assert "?." not in text and "## 04_tar_shards" in text and "## 01_jpeg_dataset" not in text


def test_every_exercise_is_in_the_full_brief_and_an_unknown_one_is_named():
    text = room.brief()
    assert all(f"## {c.notebook}" in text for c in list_checks())
    with pytest.raises(ValueError, match="no exercise 99_nothing"):
        room.brief(["99_nothing"])
