"""Key points state rules; what this machine measured stands apart, in one "On this machine:" line.

A key point is what an attendee takes home. On 25 laptops a measured verdict comes out 25
ways, so a key point that states one as its rule ("workers help: two gave 1.03 times ...,
no clear difference") teaches the contradiction. Every chapter's key-point block is a list
of rules with no measurement in them, followed by a line that starts "On this machine:"
and carries every number and verdict the chapter's run produced.
"""

from __future__ import annotations

import re

import pytest

from packlab import paths

CHAPTERS = sorted((paths.repo_root() / "chapters").glob("[0-9][0-9]_*.md"))
BLOCK = re.compile(r"```\{admonition\} Key points\n:class: important\n(.*?)\n```\n", re.S)
#: What marks a measurement or a verdict of this build in a sentence: a measured value ({eval}), or words
#: that point at this run.
MEASURED = re.compile(r"\{eval\}|\bhere\b|\bthis machine\b|\bthese runs\b|\bin ours\b|\b(?:was|were) clearly\b"
                      r"|\bclearly (?:faster|slower|better|worse)\b", re.I)
MACHINE_LINE = "On this machine: "


def key_points(text: str) -> tuple[list[str], str]:
    """The rules (the list's items) and the "On this machine:" paragraph of a chapter's key-point block."""
    (body,) = BLOCK.findall(text)
    rules_part, _, machine = body.partition("\n\n" + MACHINE_LINE)
    rules = [item.strip() for item in re.split(r"^- ", rules_part, flags=re.M) if item.strip()]
    return rules, (MACHINE_LINE + machine if machine else "")


def measured_rules(text: str) -> list[str]:
    """Key points that state a measurement or a verdict of this build as their rule."""
    rules, _ = key_points(text)
    return [rule for rule in rules if MEASURED.search(rule)]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_key_point_states_its_rule_and_the_measurement_stands_apart(chapter):
    text = chapter.read_text()
    rules, machine = key_points(text)
    assert len(rules) >= 3, f"{chapter.name}: the key points should list the chapter's rules"
    assert not measured_rules(text), f"{chapter.name}: key points that state a measurement as their rule"
    assert machine.startswith(MACHINE_LINE) and "{eval}" in machine, (
        f"{chapter.name}: the key points end with one 'On this machine: ...' line carrying what was measured")
    assert "\n- " not in machine, f"{chapter.name}: the 'On this machine' line comes after every rule"


def test_a_verdict_stated_as_a_rule_is_caught():
    """The check can fail: the key point the instructor review quoted (chapter 1, before the split)."""
    before = ("```{admonition} Key points\n:class: important\n"
              "- A map-style dataset over a folder needs only the labels file as its index.\n"
              "- Workers help CPU-bound loading up to about one per core: two gave {eval}`speedup_2w`\n"
              "  times the single-process rate here ({eval}`workers_verdict`).\n"
              "```\n")
    assert measured_rules(before) == ["Workers help CPU-bound loading up to about one per core: two gave "
                                      "{eval}`speedup_2w`\n  times the single-process rate here "
                                      "({eval}`workers_verdict`)."]
    unmeasured = "- Two workers with their own handles were clearly slower in these runs.\n"
    assert measured_rules(before.replace("- A map-style", unmeasured + "- A map-style"))[0].startswith("Two workers")


def test_chapter_1_says_why_workers_can_lose_when_they_do_not_fork():
    rules, machine = key_points((paths.repo_root() / "chapters" / "01_jpeg_files.md").read_text())
    workers = next(rule for rule in rules if rule.startswith("Workers help"))
    assert all(word in workers for word in ("`spawn`", "`forkserver`", "imports torch", "short epoch"))
    assert "{eval}`start_method`" in machine
