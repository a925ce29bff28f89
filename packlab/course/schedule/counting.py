"""Counting what a reader meets in a MyST notebook: words of prose, code cells, sections, solution lines."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_CODE_CELL = re.compile(r"^(`{3,})\{code-cell\}")
_WORD = re.compile(r"\w")
_HEADING = re.compile(r"^(#{2,6})\s+(.*?)\s*$")
#: The opening of a Predict or a Try-it box: ```` ```{admonition} Predict ```` (backticks or colons).
_ACTIVITY = re.compile(r"^(?:`{3,}|:{3,})\{admonition\}\s+(Predict|Try it)\b")


@dataclass(frozen=True)
class NotebookText:
    """What a reader meets in one MyST notebook: words of prose, cells of code, and the room's activities.

    ``predicts`` and ``try_its`` count the chapter's ``{admonition} Predict`` and
    ``{admonition} Try it`` boxes: each is time the room spends, not time it reads.
    """

    words: int
    code_cells: int
    predicts: int = 0
    try_its: int = 0


def count_activities(markdown_lines: list[str]) -> tuple[int, int]:
    """``(predicts, try_its)``: how many Predict and Try-it boxes the markdown opens."""
    kinds = [m.group(1) for m in (_ACTIVITY.match(line.strip()) for line in markdown_lines) if m]
    return kinds.count("Predict"), kinds.count("Try it")


def body_lines(text: str) -> list[str]:
    """A MyST notebook's lines after its front matter (``---`` ... ``---``)."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":
        closing = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if closing is not None:
            lines = lines[closing + 1 :]
    return lines


def split_myst(text: str) -> tuple[list[str], list[str]]:
    """Split a MyST notebook into its markdown lines and its code cells' sources.

    A code cell is a fence that opens with ```` ```{code-cell} ```` (three backticks or
    more) and closes with a line of the same backticks; everything else, after the
    front matter (``---`` ... ``---``), is markdown.
    """
    found = blocks(text)
    return [v for k, v in found if k == "markdown"], [v for k, v in found if k == "cell"]


def blocks(text: str) -> list[tuple[str, str]]:
    """A MyST notebook in reading order: ``("markdown", line)`` for each line of prose, ``("cell", source)`` per code cell."""
    out: list[tuple[str, str]] = []
    fence: str | None = None
    body: list[str] = []
    for line in body_lines(text):
        if fence is None:
            opening = _CODE_CELL.match(line.strip())
            if opening:
                fence, body = opening.group(1), []
            else:
                out.append(("markdown", line))
        elif line.strip() == fence:
            out.append(("cell", "\n".join(body)))
            fence = None
        else:
            body.append(line)
    return out


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
    return NotebookText(prose_words(markdown), sum(not input_hidden(cell) for cell in cells), *count_activities(markdown))


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
    predicts: int = 0
    try_its: int = 0


def sections(text: str) -> list[Section]:
    """Every section of a MyST notebook, in order, with the words and code cells a reader meets in it.

    ``code_cells`` leaves out cells whose input is hidden (as :func:`count_notebook`
    does); ``all_cells`` counts every cell, for the share of the running time.
    """
    found_blocks = blocks(text)
    headings = {i: _HEADING.match(v) for i, (k, v) in enumerate(found_blocks) if k == "markdown" and _HEADING.match(v)}
    found = []
    for index, heading in headings.items():
        level, title = len(heading.group(1)), heading.group(2)
        end = next((j for j, later in headings.items() if j > index and len(later.group(1)) <= level), len(found_blocks))
        inside = found_blocks[index:end]
        text_lines = [v for k, v in inside if k == "markdown"]
        code = [v for k, v in inside if k == "cell"]
        found.append(Section(title, level, prose_words(text_lines), sum(not input_hidden(c) for c in code), len(code),
                             *count_activities(text_lines)))
    return found


@dataclass(frozen=True)
class Episode:
    """A taught unit of a chapter: everything up to and including the hands-on that ends it.

    ``ends_with`` is ``"predict"`` (a Predict box and the visible code cell that answers
    it), ``"try it"`` (a Try-it box) or ``"end"`` (the chapter's last stretch, which hands
    over to its exercise or its key points). ``title`` is the first heading inside it, if any.
    """

    title: str
    words: int
    code_cells: int
    all_cells: int
    predicts: int
    try_its: int
    ends_with: str


def episodes(text: str) -> list[Episode]:
    """A MyST chapter cut into :class:`Episode` s, each ending at a hands-on (see :class:`Episode`).

    A Predict ends its episode with the first visible code cell after the box (the cell
    that answers it); a Try-it ends its episode with the box itself.
    """
    found: list[Episode] = []
    prose: list[str] = []
    cells: list[str] = []
    kinds: list[str] = []

    def close(ends_with: str) -> None:
        title = next((m.group(2) for m in map(_HEADING.match, prose) if m), "")
        found.append(Episode(title, prose_words(prose), sum(not input_hidden(c) for c in cells), len(cells),
                             kinds.count("Predict"), kinds.count("Try it"), ends_with))
        prose.clear(), cells.clear(), kinds.clear()

    box_fence, awaiting_answer = None, False
    for kind, value in blocks(text):
        if kind == "cell":
            cells.append(value)
            if awaiting_answer and not input_hidden(value):
                awaiting_answer = False
                close("predict")
            continue
        prose.append(value)
        stripped = value.strip()
        activity = _ACTIVITY.match(stripped)
        if activity:
            kinds.append(activity.group(1))
            if activity.group(1) == "Predict":
                awaiting_answer = True
            else:
                box_fence = re.match(r"[`:]+", stripped).group(0)
        elif box_fence is not None and stripped == box_fence:
            box_fence = None
            close("try it")
    if prose or cells or kinds:
        close("end")
    return found
