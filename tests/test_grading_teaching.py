"""Hints that teach: a nudge first, the code-level hint on request, nothing for a stub; stages.

A failed part prints its nudge (level 1, :mod:`packlab.course.grading.teaching`) by default
and its code-level hint (level 2, registered with the part) only with ``hints=2``; a part
that fails on the exercise's untouched stub is "not started" and prints neither. Every
registered part has a nudge of its own, and a stage of a long exercise names real parts.
The checks here use exercise 5's split function: pure Python, so each check takes
moments.
"""

from __future__ import annotations

import pytest

from packlab import paths
from packlab.course import exercises, grade, grading
from packlab.course.grading import core, teaching

ROOT = paths.repo_root()


def wrong_split(shards, rank, world_size, worker_id, num_workers):
    """Contiguous equal chunks: drops the remainder and never raises for too few shards."""
    size = len(shards) // (world_size * num_workers)
    reader = rank * num_workers + worker_id
    return list(shards[reader * size:(reader + 1) * size])


def the_solution():
    return dict(grade.notebook_candidates(ROOT / "solutions" / "05_shard_split.md"))["shard_split"]


def the_stub():
    return dict(grade.notebook_candidates(ROOT / "exercises" / "05_shard_split.md"))["shard_split"]


def code_hints(check_id: str) -> list[str]:
    return [part.hint for part in core._EXERCISES[check_id].parts]


def test_every_registered_part_has_a_nudge_of_its_own():
    missing, same = [], []
    for info in grading.list_checks():
        parts = core._EXERCISES[info.id].parts
        for part in parts:
            nudge = teaching.NUDGES.get(info.id, {}).get(part.name)
            if not nudge:
                missing.append(f"{info.id}.{part.name}")
            elif nudge == part.hint:
                same.append(f"{info.id}.{part.name}")
    assert not missing, f"parts without a nudge in packlab/course/grading/teaching.py: {missing}"
    assert not same, f"a nudge must not repeat the code-level hint: {same}"


def test_no_nudge_or_stage_for_a_part_that_does_not_exist():
    registered = {info.id: set(info.parts) for info in grading.list_checks()}
    stale = [f"{check}.{part}" for check, nudges in teaching.NUDGES.items() for part in nudges
             if part not in registered.get(check, set())]
    assert not stale, f"nudges for parts no check has: {stale}"
    for check_id, stages in teaching.STAGES.items():
        seen: list[str] = []
        for stage, parts in stages.items():
            assert parts, f"{check_id}: stage {stage!r} is empty"
            unknown = set(parts) - registered[check_id]
            assert not unknown, f"{check_id}: stage {stage!r} names parts the check does not have: {unknown}"
            seen += parts
        assert len(seen) == len(set(seen)), f"{check_id}: a part is in two stages"


def test_exercise_4_has_a_core_and_a_stretch_that_together_are_the_whole_reader_check():
    stages = teaching.STAGES["tar_dataset"]
    assert set(stages) == {"core", "stretch"}
    assert set(stages["core"]) | set(stages["stretch"]) == set(p.name for p in core._EXERCISES["tar_dataset"].parts)
    assert "one_process" in stages["core"] and "truncated_shard" in stages["stretch"]
    assert set(teaching.STAGES["tar_write"]["core"]) == {p.name for p in core._EXERCISES["tar_write"].parts}


def test_the_stubs_raise_what_the_checks_call_not_started():
    assert core.STUB_MESSAGE in exercises.STUB and "NotImplementedError" in exercises.STUB
    assert core.is_stub_failure('in a DataLoader worker: NotImplementedError: your code here (cell 4, line 12)')
    assert not core.is_stub_failure("NotImplementedError: pickling is not supported")
    assert not core.is_stub_failure("ValueError: your code here")


def test_a_stubs_first_check_says_not_started_and_prints_no_hint(capsys):
    result = grading.check("shard_split", the_stub(), record=False)
    printed = capsys.readouterr().out
    assert result.score == 0 and all(part.status == "not started" for part in result.parts)
    assert "Not started yet" in printed and "NotImplementedError" in printed
    assert "think:" not in printed and "hint:" not in printed
    for hint in code_hints("shard_split") + list(teaching.NUDGES["shard_split"].values()):
        assert hint not in printed


def test_a_failed_part_gives_a_nudge_first_and_the_code_hint_on_request(capsys):
    result = grading.check("shard_split", wrong_split, record=False)
    printed = capsys.readouterr().out
    failed = [part for part in result.parts if part.status == "failed"]
    assert {part.name for part in failed} >= {"exactly_once", "too_few_shards"}
    for part in failed:
        assert f"think: {teaching.NUDGES['shard_split'][part.name]}" in printed
        assert part.hint not in printed, "the code-level hint must wait for hints=2"
    assert "hints=2" in printed, "the report says how to get the code-level hint"

    grading.check("shard_split", wrong_split, record=False, hints=2)
    printed = capsys.readouterr().out
    for part in failed:
        assert f"think: {part.nudge}" in printed and f"hint: {part.hint}" in printed

    grading.check("shard_split", wrong_split, record=False, hints=0)
    printed = capsys.readouterr().out
    assert "✗ exactly_once" in printed and "think:" not in printed and "hint:" not in printed


def test_the_report_can_be_printed_again_at_another_level():
    result = grading.check("shard_split", wrong_split, record=False, quiet=True)
    assert "hint:" not in str(result) and "hint:" in result.report(hints=2)
    with pytest.raises(ValueError, match="hints"):
        result.report(hints=3)
    with pytest.raises(ValueError, match="hints"):
        grading.check("shard_split", wrong_split, record=False, quiet=True, hints="all")


def test_parts_takes_a_stage_name(monkeypatch, capsys):
    monkeypatch.setitem(teaching.STAGES, "shard_split", {"quick": ("pure", "balanced")})
    result = grading.check("shard_split", the_solution(), parts="quick", record=False)
    assert [part.name for part in result.parts] == ["balanced", "pure"] and result.passed
    with pytest.raises(ValueError, match="no stage 'stretch'.*'quick'"):
        grading.check("shard_split", the_solution(), parts="stretch", record=False)
    single = grading.check("shard_split", the_solution(), parts="pure", record=False, quiet=True)
    assert [part.name for part in single.parts] == ["pure"]


def test_a_part_without_a_nudge_still_gets_one_from_its_description(monkeypatch):
    monkeypatch.setitem(teaching.NUDGES, "shard_split", {})
    assert teaching.nudge("shard_split", "pure", "does not change its input") == (
        "look again at what this part checks: does not change its input")
