"""``make test``: the unit tests, the notebooks and the browser tests, in four phases.

1. **Unit tests marked ``serial``**, first, with nothing else running (two at a time on
   two cores, each with a core of its own): they time something.
2. **Every chapter and solution notebook under nbval**, one at a time and alone: the book
   shows what these runs measured (:mod:`packlab.course.pytest_book_cache` hands them to
   the book's execution cache), so nothing else may compete for the cores meanwhile.
3. **The other unit tests**, several at a time (pytest-xdist): most of them wait for
   worker processes to start, kernels to boot, servers to answer or fakes to sleep, and
   waiting overlaps well even on two cores;
4. **and, at the same time, the tests marked ``needs_book``** (the browser tests), which
   build the book from the notebooks' cache and drive JupyterLab, one test file per
   process. Neither phase times anything, so they may share the machine; the browser
   tests' output is printed when they end, not mixed into the unit tests'.
5. **and, at the same time, every chapter and solution notebook again, as on the machines
   the room brings**, in the small-data mode (:data:`SMALL_COUNT` images; the notebooks
   converted into ``_build/nbtest-small/``). These are crash tests, not timings: nothing
   goes to the book's cache, so they may share the cores with the unit tests (at a lower
   priority, ``nice``). Two phases:

   * ``notebooks-16-cores-no-ptrace``: every notebook; the course sees 16 cores
     (``PACKLAB_VISIBLE_CORES``: its workers really start, on the cores there are), and
     ``py-spy`` is a stand-in that refuses to attach to another process as Yama's
     ``ptrace_scope = 1`` makes it refuse (:data:`PTRACE_REFUSED_PYSPY`), so chapter 11's
     profiling cells take their fallback. Its data is generated under ``_build/small-data/``;
   * ``notebooks-8-cores-user``: the course sees 8 cores and runs as **a throwaway normal
     account** (:mod:`packlab.course.attendee_account`), which generates its own data,
     runs the doctor and then the notebooks a normal account must run
     (:data:`NORMAL_ACCOUNT_NOTEBOOKS`) and every notebook that reads the course's core
     count (:data:`CORE_READERS`). A notebook that never reads it runs the same code at 8
     cores as at 16, so the 16-core phase covers it. That list is checked, not trusted:
     the 16-core phase logs every notebook that read the emulated count
     (:mod:`packlab.course.pytest_core_reads`), and the 8-core phase fails when one of
     them is missing from its list.

   In both, a measurement takes at most :data:`CRASH_TEST_ROUNDS` rounds
   (``PACKLAB_CRASH_TEST_ROUNDS``, read by :mod:`packlab.bench`): every line runs, with the
   workers the machine would start, but no verdict is asked of these runs.

Every phase runs even when an earlier one failed, so one run reports everything; the
exit status is non-zero when any phase failed. A phase that collects no test at all is
a failure too (pytest's exit status 5): it means the markers or paths went wrong; only
the serial phase may be empty, when no test needs the machine to itself. The wall time
of each phase (and of the whole run) is printed at the end and written to
``_build/test-times.json``.

``python -m packlab.course.testrun --jobs N`` sets the number of parallel unit-test
processes (``make test TEST_JOBS=N``); ``--only unit,notebooks`` runs some phases.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from packlab import paths
from packlab.course.pytest_book_cache import NBTEST_DIR

#: The phases that run the notebooks as on attendees' machines: name -> cores the course sees.
MACHINE_PHASES = {"notebooks-8-cores-user": 8, "notebooks-16-cores-no-ptrace": 16}
PHASES = ("serial", "notebooks", "unit", "browser", *MACHINE_PHASES)
#: Phases run one group after another; the phases of one group run at the same time.
STAGES = (("serial",), ("notebooks",), ("unit", "browser", *MACHINE_PHASES))
#: What the normal account must run besides the data and the doctor: chapters 0, 1, 4, 7, 8 and 11
#: and two exercise checks (a worker count from the attendee's cores, a grader's own processes).
NORMAL_ACCOUNT_NOTEBOOKS = ("chapters/00_setup", "chapters/01_jpeg_files", "chapters/04_per_worker_handles",
                            "chapters/07_how_fast_is_enough", "chapters/08_process_boundary",
                            "chapters/11_past_the_decode_ceiling", "solutions/03_per_worker_zip",
                            "solutions/07_parallel_map")
#: The notebooks that read the course's core count (``packlab.cpus``), as the 16-core phase's log
#: last found them: they run at 8 cores too. make test fails when the log names one not here.
CORE_READERS = ("chapters/00_setup", "chapters/01_jpeg_files", "chapters/02_zip", "chapters/03_zip_pitfall",
                "chapters/04_per_worker_handles", "chapters/05_tar_shards", "chapters/07_how_fast_is_enough",
                "chapters/08_process_boundary", "chapters/09_other_formats", "chapters/10_beyond_one_machine",
                "chapters/11_past_the_decode_ceiling", "chapters/13_what_shortcuts_cost",
                "chapters/14_storing_echoing_mixing", "chapters/15_at_scale",
                "solutions/01_jpeg_dataset", "solutions/02_zip_packing", "solutions/03_per_worker_zip",
                "solutions/06_bottleneck", "solutions/07_parallel_map", "solutions/12_interleaved_shuffle")
#: The 16-core phase's log of the notebooks that read the emulated core count.
CORE_READS_LOG = Path("_build") / "core-reads-16.log"
#: Rounds per measurement in the many-cores phases: crash tests, not verdicts (see the module's docstring).
CRASH_TEST_ROUNDS = 1
#: The small-data mode's size (setup.md recommends it for a JupyterHub with a small quota).
SMALL_COUNT = 2000
#: A py-spy that refuses to attach as Yama's ptrace_scope = 1 makes it refuse a normal user (chapter 11's fallback).
PTRACE_REFUSED_PYSPY = Path("tests") / "standins" / "py-spy-ptrace-refused"
#: The small-data phase's notebooks run behind the unit tests for the cores (``nice``, where there is one).
NICE = ["nice", "-n", "10"] if shutil.which("nice") else []
#: Where the small-data phase converts its notebooks and generates its dataset.
NBTEST_SMALL_DIR = Path("_build") / "nbtest-small"
SMALL_DATA_DIR = Path("_build") / "small-data"
#: Processes for the tests marked ``serial``: one per core, at most two.
SERIAL_JOBS = max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
#: Phases that may select no test at all (pytest's exit status 5 there is not a failure).
MAY_BE_EMPTY = {"serial"}
NO_TESTS_COLLECTED = 5
#: Parallel unit-test processes on a machine with ``cores`` cores: the tests mostly wait.
DEFAULT_JOBS_PER_CORE = 2


def notebook_sources(root: Path) -> list[Path]:
    """Every numbered chapter and solution notebook (``chapters/NN_*.md``, ``solutions/NN_*.md``)."""
    found = []
    for folder in ("chapters", "solutions"):
        found += sorted(p for p in (root / folder).glob("[0-9]*.md") if ".ipynb_checkpoints" not in p.parts)
    return found


def convert_notebooks(root: Path, out_dir: Path = NBTEST_DIR) -> list[Path]:
    """Write each MyST notebook as ``<out_dir>/<folder>/<name>.ipynb`` for nbval (default ``_build/nbtest/``); return the paths."""
    import jupytext  # in this process: one ``python -m jupytext`` per notebook cost ~5 s each on 2 cores

    out = root / out_dir
    shutil.rmtree(out, ignore_errors=True)
    converted = []
    for source in notebook_sources(root):
        target = out / source.relative_to(root).with_suffix(".ipynb")
        target.parent.mkdir(parents=True, exist_ok=True)
        jupytext.write(jupytext.read(source), target, fmt="ipynb")
        converted.append(target)
    return converted


def small_data_env(root: Path) -> dict[str, str]:
    """The small-data phases' environment: count and data folder, whatever the checkout's settings say.

    ``PACKLAB_CORES`` is dropped: a cap in this checkout's settings would hide the many cores
    the phases emulate (``PACKLAB_SETTINGS`` points at no file).
    """
    env = {k: v for k, v in os.environ.items() if k != "PACKLAB_CORES"}
    return {**env, "PACKLAB_COUNT": str(SMALL_COUNT), "PACKLAB_DATA": str(root / SMALL_DATA_DIR),
            "PACKLAB_SETTINGS": str(root / SMALL_DATA_DIR / "no-settings.mk"),
            "PACKLAB_CRASH_TEST_ROUNDS": str(CRASH_TEST_ROUNDS)}


def many_cores_env(cores: int, ptrace_refused: bool = False):
    """The environment of a phase that emulates ``cores`` visible cores (and a py-spy refused ptrace)."""
    def env(root: Path) -> dict[str, str]:
        extra = {"PACKLAB_VISIBLE_CORES": str(cores)}
        if ptrace_refused:  # the stand-in hands what Yama allows to the real py-spy, installed beside this Python
            extra.update(PACKLAB_PYSPY=str(root / PTRACE_REFUSED_PYSPY),
                         PACKLAB_REAL_PYSPY=str(Path(sys.executable).with_name("py-spy")),
                         # this phase runs every notebook: it logs which of them read the core count
                         PACKLAB_CORE_READS_LOG=str(root / CORE_READS_LOG))
        return {**small_data_env(root), **extra}
    return env


def notebook_key(notebook: Path) -> str:
    """``chapters/01_jpeg_files`` for ``.../chapters/01_jpeg_files.ipynb``: how the lists above name a notebook."""
    return f"{notebook.parent.name}/{notebook.stem}"


def eight_core_notebooks(small_notebooks: list[Path]) -> list[Path]:
    """The notebooks of the 8-core phase: those a normal account must run and those that read the core count."""
    wanted = set(NORMAL_ACCOUNT_NOTEBOOKS) | set(CORE_READERS)
    return [n for n in small_notebooks if notebook_key(n) in wanted]


def unlisted_core_readers(log: Path) -> list[str] | None:
    """Notebooks the 16-core phase saw read the core count that the 8-core phase did not run; None without a log."""
    from packlab.course.pytest_core_reads import notebooks_that_read

    if not log.exists():
        return None
    return sorted(notebooks_that_read(log) - set(CORE_READERS) - set(NORMAL_ACCOUNT_NOTEBOOKS))


def phase_commands(jobs: int, cell_timeout: int, notebooks: list[Path],
                   small_notebooks: list[Path] | None = None) -> dict[str, list[str]]:
    """The pytest command line of each phase."""
    # The 20 slowest tests or cells of each phase are listed at its end: where the time went.
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--durations=20"]
    # Every nbval run: kernels end with a shutdown request, as JupyterLab ends them (packlab.course.pytest_kernel_exit).
    nbval = ["--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout}",
             "-p", "packlab.course.pytest_kernel_exit"]

    # The small-data notebooks (as "python -m pytest ...", the first word left out for the normal account's Python).
    def nbval_args(notebooks: list[Path]) -> list[str]:
        return ["-m", "pytest", "-p", "no:cacheprovider", "--durations=20", *map(str, notebooks), *nbval]

    small_notebooks = small_notebooks or []
    return {
        "unit": [*pytest, "tests", "-m", "not serial and not needs_book", "-n", str(jobs), "--dist", "load",
                 # Two tests at a time per process, the longest first (tests/conftest.py).
                 "--maxschedchunk", "2"],
        # Two at a time on two cores or more, each with a core of its own: these tests time fakes that
        # mostly sleep, and go wrong only when a crowd of other tests delays them.
        "serial": [*pytest, "tests", "-m", "serial and not needs_book", "-n", str(SERIAL_JOBS)],
        "notebooks": [*pytest, *map(str, notebooks), *nbval, "-p", "packlab.course.pytest_book_cache"],
        # The browser tests (the book, JupyterLab, the class hub) mostly wait on a browser: one file per process.
        # Its own temporary folder: it runs beside the unit tests' session.
        "browser": [*pytest, "tests", "-m", "needs_book", "-p", "packlab.course.pytest_book_cache",
                    "-n", "2", "--dist", "loadfile", f"--basetemp={paths.build_dir() / 'pytest-browser'}"],
        # Not handed to the book's cache: these runs measure the small dataset beside the unit tests, at a lower
        # priority (nice), so that the unit tests that wait with a timeout get the cores first.
        # A normal account: generates its data, runs the doctor, then its notebooks (its temporary folder in its home).
        "notebooks-8-cores-user": [*NICE, sys.executable, "-m", "packlab.course.attendee_account", "--keep-env",
                                   "PACKLAB_COUNT,PACKLAB_VISIBLE_CORES,PACKLAB_SETTINGS,PACKLAB_CRASH_TEST_ROUNDS",
                                   "--", "bash", "-c", 'python -m packlab.data -q && python -m packlab.course.doctor && '
                                   f'exec python {shlex.join(nbval_args(eight_core_notebooks(small_notebooks)))} '
                                   '--basetemp="$HOME/pytest"'],
        # Every notebook, each named to its kernel so that the core-reads log can say which read the count.
        "notebooks-16-cores-no-ptrace": [*NICE, sys.executable, *nbval_args(small_notebooks), "-p",
                                         "packlab.course.pytest_core_reads",
                                         f"--basetemp={paths.build_dir() / 'pytest-16-cores'}"],
    }


#: Phases that run with an environment of their own.
PHASE_ENV = {"notebooks-8-cores-user": many_cores_env(8),
             "notebooks-16-cores-no-ptrace": many_cores_env(16, ptrace_refused=True)}


def _run_stage(stage: list[str], commands: dict[str, list[str]], root: Path) -> dict[str, dict]:
    """Run the phases of one stage at the same time; the first one's output streams, the others' follow it."""
    import tempfile

    running = {}
    start = time.perf_counter()
    for index, phase in enumerate(stage):
        print(f"\n==== make test, phase {phase}: {' '.join(commands[phase][2:])}", flush=True)
        log = None if index == 0 else tempfile.TemporaryFile(mode="w+")
        env = PHASE_ENV[phase](root) if phase in PHASE_ENV else None
        running[phase] = (subprocess.Popen(commands[phase], cwd=root, stdout=log, stderr=subprocess.STDOUT if log else None,
                                           env=env), log)
    times = {}
    for phase, (process, log) in running.items():
        status = process.wait()
        times[phase] = {"seconds": round(time.perf_counter() - start, 1), "exit_status": status}
        if log is not None:
            log.seek(0)
            print(f"\n==== make test, phase {phase} (ran beside {stage[0]}), its output:", flush=True)
            print(log.read(), flush=True)
            log.close()
        if phase in MAY_BE_EMPTY and status == NO_TESTS_COLLECTED:
            print(f"(no test is marked for the {phase} phase)", flush=True)
            times[phase]["exit_status"] = 0
    return times


def _check_core_readers(stage_times: dict[str, dict], root: Path) -> None:
    """Fail the 8-core phase when the 16-core phase saw a notebook read the core count that it did not run."""
    eight, sixteen = "notebooks-8-cores-user", "notebooks-16-cores-no-ptrace"
    if eight not in stage_times or sixteen not in stage_times or stage_times[sixteen]["exit_status"] != 0:
        return
    unlisted = unlisted_core_readers(root / CORE_READS_LOG)
    if unlisted is None:
        print(f"\n==== make test: the 16-core phase wrote no {CORE_READS_LOG}: the core-reads instrument "
              "(packlab.course.pytest_core_reads) is broken, so the 8-core phase's list is unchecked", flush=True)
    elif unlisted:
        print(f"\n==== make test: these notebooks read the core count but did not run at 8 cores: {', '.join(unlisted)}; "
              "add them to CORE_READERS in packlab/course/testrun.py", flush=True)
    else:
        return
    stage_times[eight]["exit_status"] = stage_times[eight]["exit_status"] or 1


def compile_sources(root: Path) -> None:
    """Write the bytecode of the course's own modules and tests once, before the phases start.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (as on CI machines and some images), no process
    writes it, and each of the thousand-odd processes of a run (kernels, spawned workers,
    graders) would compile ``packlab`` again; the environment's packages are compiled when
    ``make setup`` installs them (``uv pip install --compile-bytecode``).
    """
    import compileall

    for folder in ("packlab", "tests"):
        compileall.compile_dir(root / folder, quiet=1, workers=0)


def run(only: list[str], jobs: int, cell_timeout: int, extra: list[str]) -> int:
    root = paths.repo_root()
    compile_sources(root)
    notebooks = convert_notebooks(root) if "notebooks" in only else []
    small = convert_notebooks(root, NBTEST_SMALL_DIR) if set(MACHINE_PHASES) & set(only) else []
    (root / CORE_READS_LOG).unlink(missing_ok=True)
    if small:  # the small dataset, before its phases start (seconds; nothing if it is there already)
        subprocess.run([sys.executable, "-m", "packlab.data", "-q"], cwd=root, env=small_data_env(root), check=True,
                       timeout=1800)
    commands = {phase: command + extra
                for phase, command in phase_commands(jobs, cell_timeout, notebooks, small).items()}
    times: dict[str, dict] = {}
    total = 0.0
    for stage in STAGES:
        selected = [phase for phase in stage if phase in only]
        if not selected:
            continue
        stage_times = _run_stage(selected, commands, root)
        _check_core_readers(stage_times, root)
        times.update(stage_times)
        total += max(r["seconds"] for r in stage_times.values())
    print("\n==== make test: wall time per phase")
    for stage in STAGES:
        shown = [phase for phase in stage if phase in times]
        for phase in shown:
            result = times[phase]
            state = "passed" if result["exit_status"] == 0 else f"FAILED (pytest exit status {result['exit_status']})"
            beside = f" (beside {shown[0]})" if phase != shown[0] else ""
            print(f"  {phase:<10} {result['seconds']:>7.1f} s  {state}{beside}")
    print(f"  {'total':<10} {total:>7.1f} s (wall)")
    out = paths.build_dir() / "test-times.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"jobs": jobs, "phases": times, "total_seconds": round(total, 1)}, indent=2))
    return 0 if all(r["exit_status"] == 0 for r in times.values()) else 1


def main(argv: list[str] | None = None) -> int:
    from packlab import data

    parser = argparse.ArgumentParser(prog="python -m packlab.course.testrun", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"parallel unit-test processes (default {DEFAULT_JOBS_PER_CORE} per core)")
    parser.add_argument("--only", default=",".join(PHASES), help=f"comma-separated phases of {','.join(PHASES)}")
    parser.add_argument("--cell-timeout", type=int, default=600, help="seconds per notebook cell (default 600)")
    args, extra = parser.parse_known_args(argv)
    only = [p for p in args.only.split(",") if p]
    unknown = set(only) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}; known: {', '.join(PHASES)}")
    jobs = args.jobs or max(2, DEFAULT_JOBS_PER_CORE * data.available_cores())
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run(only, jobs, args.cell_timeout, extra)


if __name__ == "__main__":
    sys.exit(main())
