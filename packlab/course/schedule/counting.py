"""Counting what a reader meets in a MyST notebook: words of prose, code cells, sections, solution lines."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_CODE_CELL = re.compile(r"^(`{3,})\{code-cell\}")
_WORD = re.compile(r"\w")
_HEADING = re.compile(r"^(#{2,6})\s+(.*?)\s*$")


@dataclass(frozen=True)
class NotebookText:
    """What a reader meets in one MyST notebook: words of prose and cells of code."""

    words: int
    code_cells: int


def split_myst(text: str) -> tuple[list[str], list[str]]:
    """Split a MyST notebook into its markdown lines and its code cells' sources.

    A code cell is a fence that opens with ```` ```{code-cell} ```` (three backticks or
    more) and closes with a line of the same backticks; everything else, after the
    front matter (``---`` ... ``---``), is markdown.
    """
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":
        closing = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if closing is not None:
            lines = lines[closing + 1 :]
    markdown: list[str] = []
    cells: list[str] = []
    fence: str | None = None
    body: list[str] = []
    for line in lines:
        if fence is None:
            opening = _CODE_CELL.match(line.strip())
            if opening:
                fence, body = opening.group(1), []
            else:
                markdown.append(line)
        elif line.strip() == fence:
            cells.append("\n".join(body))
            fence = None
        else:
            body.append(line)
    return markdown, cells


def prose_words(markdown_lines: list[str]) -> int:
    """Words a reader reads in markdown: tokens with a letter or digit, markup left out.

    Left out: HTML comments (instructors' notes), MyST comments (``% ...``), cell breaks
    (``+++``), target labels (``(name)=``), directive fences and their ``:option:`` lines.
    A role such as ``{eval}`rate``` counts as the one word it shows.
    """
    text = re.sub(r"<!--.*?-->", " ", "\n".join(markdown_lines), flags=re.DOTALL)
    words = 0
    for line in text.splitlines():
        stripped = line.strip()
        if (
            stripped.startswith(("%", "+++", "```", "~~~"))
            or re.fullmatch(r"\(.+\)=", stripped)
            or re.match(r":[\w-]+:", stripped)
        ):
            continue
        words += sum(1 for token in stripped.split() if _WORD.search(token))
    return words


def input_hidden(cell: str) -> bool:
    """Whether a code cell's input is hidden from readers (its options carry the ``remove-input`` tag).

    The options come first in the cell, as ``:tags: [...]`` lines or as a YAML block between
    ``---`` lines; the chapters hide the cells that only hand measured numbers to the prose.
    """
    if cell.startswith("---\n") and "\n---" in cell:
        options = cell.split("\n---", 1)[0]
    else:
        options = "\n".join(line for line in cell.splitlines() if line.startswith(":"))
    return "remove-input" in options


def count_notebook(path: Path) -> NotebookText:
    """Words of prose and number of code cells a reader sees (hidden inputs left out) of the MyST notebook at ``path``."""
    markdown, cells = split_myst(path.read_text(encoding="utf-8"))
    return NotebookText(prose_words(markdown), sum(not input_hidden(cell) for cell in cells))


def solution_lines(path: Path, leave_out: tuple[str, ...] = ()) -> int:
    """Lines an attendee writes: code lines between ``# BEGIN SOLUTION`` and ``# END SOLUTION``.

    Blank lines and comments (the hints the exercise keeps) are not counted, nor the
    blocks inside the functions or methods named in ``leave_out`` (a stage not taught).
    """
    from packlab.course.exercises import BEGIN_SOLUTION, END_SOLUTION

    count, inside, function = 0, False, None
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        defined = re.match(r"\s*def (\w+)\(", line)
        if defined:
            function = defined.group(1)
        if stripped == BEGIN_SOLUTION:
            inside = function not in leave_out
        elif stripped == END_SOLUTION:
            inside = False
        elif inside and stripped and not stripped.startswith("#"):
            count += 1
    return count


def normalise_title(title: str) -> str:
    """A heading's words as compared: no markup (backticks, emphasis), lower case, single spaces."""
    return " ".join(re.sub(r"[`*_]", "", title).lower().split())


@dataclass(frozen=True)
class Section:
    """A section of a notebook (a ``##`` to ``######`` heading and what follows, its subsections included)."""

    title: str
    level: int
    words: int
    code_cells: int
    all_cells: int


def sections(text: str) -> list[Section]:
    """Every section of a MyST notebook, in order, with the words and code cells a reader meets in it.

    ``code_cells`` leaves out cells whose input is hidden (as :func:`count_notebook`
    does); ``all_cells`` counts every cell, for the share of the running time.
    """
    blocks: list[tuple[str, object]] = []  # ("heading", (level, title)), ("markdown", line), ("cell", source)
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":
        closing = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if closing is not None:
            lines = lines[closing + 1 :]
    fence, body = None, []
    for line in lines:
        if fence is None:
            opening = _CODE_CELL.match(line.strip())
            heading = _HEADING.match(line)
            if opening:
                fence, body = opening.group(1), []
            elif heading:
                blocks.append(("heading", (len(heading.group(1)), heading.group(2))))
            else:
                blocks.append(("markdown", line))
        elif line.strip() == fence:
            blocks.append(("cell", "\n".join(body)))
            fence = None
        else:
            body.append(line)
    found = []
    for index, (kind, value) in enumerate(blocks):
        if kind != "heading":
            continue
        level, title = value
        end = next((j for j in range(index + 1, len(blocks)) if blocks[j][0] == "heading" and blocks[j][1][0] <= level),
                   len(blocks))
        inside = blocks[index : end]
        text_lines = [f"{'#' * b[1][0]} {b[1][1]}" if b[0] == "heading" else b[1] for b in inside if b[0] != "cell"]
        code = [b[1] for b in inside if b[0] == "cell"]
        found.append(Section(title, level, prose_words(text_lines), sum(not input_hidden(c) for c in code), len(code)))
    return found


