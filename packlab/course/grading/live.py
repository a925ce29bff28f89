"""Checks that speak while they run: each part shown as it starts, with its limit, then its result.

A check runs its parts one after another in a child process (see :mod:`packlab.course.grading`),
and a part may take seconds (spawn workers start) or hang until its limit. Without a word
while that happens, an attendee cannot tell a slow part from a stuck kernel, and restarts
the kernel before the limit is reached. So :func:`~packlab.course.grading.check` keeps one
live block on screen while the parts run::

    check 'per_worker_zip' on PerWorkerZipDataset: 7 parts
      ✓ no_handle_in_init       0.2 s
      ✓ pickle_after_use        0.3 s
      … fork                    running 12 s (limit 180 s)

A part's line appears when the part starts, shows how long it has been running and its
limit, and is replaced by its result when it ends; once the check is over, the block
shrinks to one line and the report follows. Where that line is drawn depends on where
the check runs:

* in a Jupyter kernel, one output (an IPython display with an id) updated in place;
* in a terminal, the running part's line redrawn in place (a carriage return), each
  finished part on a line of its own;
* anywhere else (a log file, a test capturing the output), a line when a part starts and
  one when it ends: nothing is redrawn.

``check(..., quiet=True)`` shows nothing, as before; the report with the nudges comes after
the block, as before.
"""

from __future__ import annotations

import sys
import time

#: How often a running part's line is redrawn with its elapsed time, in seconds.
TICK_SECONDS = 5.0
MARKS = {"passed": "✓", "failed": "✗", "not started": "·"}


def _kernel_display():
    """IPython's ``display`` when this runs in a Jupyter kernel, else None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return None
    from IPython.display import display

    return display


class Progress:
    """The live block of one check: which parts started, how long they ran, how each ended.

    ``stream`` is where a terminal or a log gets the lines (default ``sys.stdout``);
    ``display`` is IPython's display function (found automatically in a kernel; a test
    passes a fake). Call :meth:`started`, :meth:`tick` and :meth:`finished` as the parts
    go, :meth:`close` at the end.
    """

    def __init__(self, title: str, part_names: list[str], limit: float, stream=None, display=None, clock=time.monotonic):
        self.title = title
        self.names = list(part_names)
        self.width = max((len(n) for n in self.names), default=0)
        self.limit = limit
        self.stream = stream if stream is not None else sys.stdout
        self.clock = clock
        self.display = display if display is not None else (_kernel_display() if stream is None else None)
        self.handle = None
        self.lines: dict[int, str] = {}
        self.running: tuple[int, float] | None = None
        self.tty = self.display is None and bool(getattr(self.stream, "isatty", lambda: False)())
        self._open_line = False
        if self.display is not None:
            self.handle = self.display({"text/plain": self.text()}, raw=True, display_id=True)
        else:
            self._write(f"{self.title}\n")

    # -------------------------------------------------------------------- what is shown

    def _running_line(self, index: int, since: float) -> str:
        elapsed = self.clock() - since
        return f"  … {self.names[index].ljust(self.width)}  running {elapsed:.0f} s (limit {self.limit:.0f} s)"

    def _done_line(self, index: int, status: str, seconds: float) -> str:
        return f"  {MARKS.get(status, '✗')} {self.names[index].ljust(self.width)}  {seconds:.1f} s" + (
            "  (not started)" if status == "not started" else "")

    def text(self) -> str:
        """The whole block as it stands: the title, then one line per part started so far."""
        return "\n".join([self.title, *(self.lines[i] for i in sorted(self.lines))])

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not fail the check
            pass

    def _show(self, index: int, final: bool) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": self.text()}, raw=True)
        elif self.tty:
            self._write(("\r\033[K" if self._open_line else "") + self.lines[index] + ("\n" if final else ""))
            self._open_line = not final
        else:
            self._write(self.lines[index] + "\n")

    # -------------------------------------------------------------------- the events

    def started(self, index: int) -> None:
        """Part ``index`` has started: its line appears, with its limit."""
        self.running = (index, self.clock())
        self.lines[index] = self._running_line(index, self.running[1])
        self._show(index, final=False)

    def tick(self) -> None:
        """Redraw the running part's elapsed time (in a kernel or a terminal; a log gets no extra lines)."""
        if self.running is None or not (self.handle is not None or self.tty):
            return
        index, since = self.running
        self.lines[index] = self._running_line(index, since)
        self._show(index, final=False)

    def finished(self, index: int, status: str, seconds: float) -> None:
        """Part ``index`` ended with ``status`` (passed, failed, not started): its line shows the result."""
        if self.running is not None and self.running[0] == index:
            self.running = None
        self.lines[index] = self._done_line(index, status, seconds)
        self._show(index, final=True)

    def close(self) -> None:
        """End the block: in a kernel it shrinks to one line (the report follows); a terminal's line is finished."""
        if self.handle is not None:
            done = len([line for line in self.lines.values() if not line.lstrip().startswith("…")])
            self.handle.update({"text/plain": f"{self.title}: {done} ran"}, raw=True)
        if self._open_line:
            self._write("\n")
            self._open_line = False


class Silent:
    """The block of a quiet check: shows nothing."""

    def started(self, index: int) -> None:
        pass

    def tick(self) -> None:
        pass

    def finished(self, index: int, status: str, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass
