"""Running the room: the helpers' brief, printed from the checks themselves.

A helper walking the room needs, for the part an attendee is stuck on, what the part
checks, what to make them think about, and — only if that is not enough — what to type.
All three live with the checks (the part's description and code-level hint in its
exercise module, its nudge in :mod:`packlab.course.grading.teaching`), so the brief is
printed from there and never drifts from what ``check()`` says::

    python -m packlab.course.room brief                              # every exercise
    python -m packlab.course.room brief --exercises 01_jpeg_dataset,04_tar_shards > brief.md

The brief is Markdown: one section per exercise, one line per part, in the order the
check runs them, with the stages of a long exercise (exercise 4's core and stretch) marked.
The board (``make hub``'s ``/services/board/``, or ``make board``) says which parts to
read first: the ones with the most attendees failing.
"""

from __future__ import annotations

import argparse
import sys

from packlab.course.grading import core, list_checks, teaching


def _sentence(text: str) -> str:
    """``text`` ending like a sentence (a full stop unless it ends in one already, or in ? or !)."""
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def brief(notebooks: list[str] | None = None) -> str:
    """The helpers' brief in Markdown for ``notebooks`` (exercise notebook stems; default every exercise)."""
    checks = [c for c in list_checks() if notebooks is None or c.notebook in notebooks]
    if notebooks:
        unknown = sorted(set(notebooks) - {c.notebook for c in checks})
        if unknown:
            known = sorted({c.notebook for c in list_checks()})
            raise ValueError(f"no exercise {', '.join(unknown)}; the exercises are: {', '.join(known)}")
    out = ["# Helpers' brief", "",
           "Per part of each check: what it checks; **think:** what to ask the attendee (the nudge `check()` "
           "prints); **if stuck:** the hint at the code (`hints=2` prints it). Give the nudge first.", ""]
    for notebook in dict.fromkeys(c.notebook for c in checks):
        out += [f"## {notebook}", ""]
        for info in (c for c in checks if c.notebook == notebook):
            parts = {p.name: p for p in core.registered(info.id).parts}
            out += [f"`check(\"{info.id}\", ...)`: {info.description}", ""]
            stages = teaching.STAGES.get(info.id, {})
            for name in info.parts:
                part = parts[name]
                stage = next((s for s, names in stages.items() if name in names), None)
                out.append(f"- **{name}**{f' ({stage})' if stage else ''}: {_sentence(part.description)} "
                           f"**Think:** {_sentence(teaching.nudge(info.id, name, part.description))} "
                           f"**If stuck:** {_sentence(part.hint)}")
            out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.room", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("brief", help="the helpers' brief (Markdown) for some exercises, or all")
    made.add_argument("--exercises", default="", help="comma-separated exercise notebooks, e.g. 01_jpeg_dataset,04_tar_shards")
    args = parser.parse_args(argv)
    wanted = [n.strip() for n in args.exercises.split(",") if n.strip()] or None
    try:
        print(brief(wanted))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
