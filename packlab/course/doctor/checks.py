"""The doctor's checks: one function per need, each a function of a :class:`Facts` record.

A check returns a :class:`Result`, ✓ or ✗ with what was found and, under a ✗, what to
do. Nothing here looks at the machine (:mod:`packlab.course.doctor.machine` gathers the
facts), so the tests fake any machine by changing one fact of a good one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from packlab import paths

#: The oldest Python the course runs on (``requires-python`` in pyproject.toml).
MIN_PYTHON = (3, 10)
#: Cores the course needs: the chapters compare 0, 1 and 2 DataLoader workers.
MIN_CORES = 2
#: Memory the course needs, in GiB. Measured: a chapter's kernel and its DataLoader
#: workers together peaked at 1.7 GB (proportional set size) in chapters 0-5; chapter 7
#: keeps about 1 GB of batches in memory; JupyterLab, a browser and the system need the rest.
MIN_MEMORY_GIB = 4.0
#: Shared memory the DataLoader workers need, in MiB: two workers with two batches of 64
#: images in flight each (a batch of 64 standard 3x224x224 float32 images is 38.5 MB).
MIN_SHM_MIB = 512
#: The oldest uv that honours TORCH_BACKEND (``MIN_UV`` in the Makefile says the same; a test compares).
MIN_UV = (0, 7, 14)
#: Where a Windows drive appears inside WSL: files there are reached through a network protocol.
WSL_WINDOWS_DRIVES = "/mnt/"
#: The extensions JupyterLab needs for the chapters: lab extension folder -> what it does.
LAB_EXTENSIONS = {
    "jupyterlab-jupytext": "a .md chapter opens as a notebook",
    "jupyterlab-myst": "the {eval} numbers in the prose render",
}
#: Python packages behind them (import name -> distribution name).
LAB_PACKAGES = {"jupyterlab": "jupyterlab", "jupytext": "jupytext", "jupyterlab_myst": "jupyterlab-myst", "ipykernel": "ipykernel"}

OK, FAIL = "✓", "✗"
SETUP_PAGE = "setup.md (the book's 'Setting up' page)"


@dataclass(frozen=True)
class WorkerTrial:
    """One start method's trial: a batch of images through ``DataLoader(num_workers=2)`` (:mod:`.workers`)."""

    method: str  # fork, spawn, forkserver
    ok: bool
    seconds: float | None  # the whole trial, interpreter start included; None: timed out
    error: str = ""  # the error's last line, when it failed
    timed_out: bool = False


@dataclass(frozen=True)
class PyspyTrial:
    """Whether ``py-spy dump`` could attach to a sibling process (:func:`packlab.profiling.attach_trial`), and why not."""

    attached: bool
    said: str = ""  # what py-spy said when it could not
    permission: str = ""  # packlab.profiling.ptrace_permission(): root, the capability, Yama's scope


@dataclass(frozen=True)
class SettingLine:
    """A course setting as the doctor shows it: its value and where that came from (:mod:`packlab.settings`)."""

    name: str
    value: str
    origin: str  # "the settings file", "the environment", "the default"


@dataclass(frozen=True)
class Facts:
    """What the checks look at. :func:`gather` fills it for this machine; tests fake it."""

    python: tuple[int, int, int]
    platform: str  # sys.platform: linux, darwin, win32
    machine: str  # platform.machine(): x86_64, arm64, ...
    cores: int  # cores the course sees (packlab.cpus.visible_cores)
    memory_bytes: int | None  # None: could not tell
    data_root: Path
    free_disk_bytes: int | None
    disk_needed_bytes: int
    shm_bytes: int | None  # None: no /dev/shm (macOS, Windows)
    start_methods: tuple[str, ...]
    packages: dict[str, str | None]  # distribution -> installed version, None if missing
    pins: dict[str, str]  # distribution -> pinned version (pyproject.toml)
    lab_extensions: dict[str, bool]
    executable: str
    kernel_python: str | None  # what the notebooks' kernel (python3) runs; None if no kernelspec
    data_count: int | None  # images in the manifest; None: not generated
    data_problems: tuple[str, ...]
    expected_count: int
    count_setting: str | None = None  # a bad PACKLAB_COUNT's message
    wsl: bool = False  # Linux under Windows' WSL
    data_unverified: bool = False  # a dataset is there, but this Python cannot read it (no numpy yet)
    repo_root: Path = Path("/home/you/packed-data")  # the clone
    uv_version: tuple[int, ...] | None = None  # None: no uv on PATH nor in .tools/
    uv_path: str = ""
    settings: tuple[SettingLine, ...] = ()
    settings_problem: str | None = None  # a settings file that cannot be read
    gpu: bool = False  # an NVIDIA driver is loaded
    torch_cuda: str | None = None  # the CUDA version torch was built for (torch.version.cuda); None: a CPU build
    torch_record: str | None = None  # <environment>/.torch-backend: how make setup chose torch's build
    worker_trials: tuple[WorkerTrial, ...] | None = None  # None: not run (no torch here yet)
    course_cores: int | None = None  # what the chapters use (PACKLAB_CORES caps it); None: the same as cores
    cores_origin: str = "the default"  # where PACKLAB_CORES came from (packlab.settings.Setting.origin)
    cores_problem: str | None = None  # a PACKLAB_CORES that is not a whole number
    real_cores: int | None = None  # the affinity, when a test emulates another count (PACKLAB_VISIBLE_CORES)
    pyspy: PyspyTrial | None = None  # None: not tried (the trials were skipped)


@dataclass(frozen=True)
class Result:
    """One line of the report: what was checked, ✓ or ✗, what was found, what to do."""

    name: str
    ok: bool
    found: str
    todo: str = ""

    def lines(self) -> list[str]:
        out = [f"  {OK if self.ok else FAIL} {self.name}: {self.found}"]
        if not self.ok and self.todo:
            out += [f"      -> {line}" for line in self.todo.splitlines()]
        return out


# ------------------------------------------------------------------------ the checks


def check_python(f: Facts) -> Result:
    version = ".".join(map(str, f.python))
    if f.python[:2] >= MIN_PYTHON:
        return Result("Python", True, f"{version} ({MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer)")
    todo = "install Python 3.10 or newer and run `make setup PYTHON=python3.12` (or the version you installed)"
    if f.platform == "darwin":
        todo = ("macOS's own python3 is 3.9: `brew install python@3.12`, then `make setup PYTHON=python3.12`;\n"
                "or let uv fetch its own Python: `make setup UV_PYTHON_DOWNLOADS=automatic PYTHON=3.12`")
    return Result("Python", False, f"{version} is too old: the course needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer", todo)


def check_environment(f: Facts) -> Result:
    missing = sorted(name for name in ("torch", "torchvision") if f.packages.get(name) is None)
    if missing:
        todo = "run `make setup` (or `conda env create -f environment.yml`), then run this check with .venv/bin/python"
        if f.platform == "darwin" and f.machine == "x86_64":
            todo = ("torch 2.13 has no wheel for Intel Macs: use a Linux machine, a cluster or a JupyterHub "
                    f"(see {SETUP_PAGE})")
        return Result("environment", False, f"{', '.join(missing)} not installed in {f.executable}", todo)
    wrong = {name: (f.pins[name], f.packages.get(name)) for name in f.pins
             if f.packages.get(name) is not None and f.packages[name].split("+")[0] != f.pins[name]}
    if wrong:
        listed = ", ".join(f"{name} {have} (pinned {pinned})" for name, (pinned, have) in sorted(wrong.items()))
        return Result("environment", False, f"versions differ from pyproject.toml: {listed}",
                      "recreate the environment: `make distclean setup` (keeps nothing but the repository)")
    torch = f.packages["torch"]
    where = f"torchvision {f.packages['torchvision']}, in {f.executable}"
    if f.torch_cuda and not f.gpu:
        chosen = _setting(f, "TORCH_BACKEND") == "pypi" or (f.torch_record or "").startswith("pypi")
        if not chosen:
            prefix = str(Path(f.executable).parent.parent)
            return Result(
                "environment", False,
                f"torch {torch} is a CUDA {f.torch_cuda} build on a machine without an NVIDIA GPU: 3.6 GB of CUDA "
                "libraries the course never uses",
                f"recreate it with PyTorch's CPU wheels: `make configure TORCH_BACKEND=cpu`, then `rm -rf {prefix} && make setup`\n"
                "(check first that https://download.pytorch.org/whl/cpu/ opens from here; where it does not, "
                "`make configure TORCH_BACKEND=pypi` keeps this build on purpose)")
        why = (f.torch_record or "").partition(":")[2].strip() or "TORCH_BACKEND=pypi"
        return Result("environment", True, f"torch {torch}, PyPI's CUDA {f.torch_cuda} build ({why}; its 3.6 GB of CUDA libraries "
                                           f"go unused without a GPU), {where}")
    build = f" (CUDA {f.torch_cuda} build)" if f.torch_cuda else " (CPU-only build)"
    return Result("environment", True, f"torch {torch}{build}, {where}")


def check_kernel(f: Facts) -> Result:
    if f.kernel_python is None:
        return Result("notebook kernel", False, "no python3 kernel is registered for JupyterLab",
                      "ipykernel is missing from the environment: run `make setup`")
    if _same_file(f.kernel_python, f.executable):
        return Result("notebook kernel", True, "the notebooks' python3 kernel runs this environment's Python")
    return Result(
        "notebook kernel", False, f"the python3 kernel JupyterLab would start runs {f.kernel_python}, not {f.executable}",
        "a kernelspec in your home folder overrides the course's: remove ~/.local/share/jupyter/kernels/python3\n"
        "(see `jupyter kernelspec list`), or on a JupyterHub register the course's environment as its own kernel",
    )


def check_cores(f: Facts) -> Result:
    if f.cores_problem:
        return Result("cores", False, f.cores_problem, "fix the setting as it says, then run `make doctor` again")
    used = f.cores if f.course_cores is None else f.course_cores
    seen = f"{f.cores} cores visible"
    if f.real_cores is not None:
        seen += f" (emulated by PACKLAB_VISIBLE_CORES; this process may run on {f.real_cores})"
    why = "every one" if used == f.cores else f"PACKLAB_CORES={used}, {f.cores_origin}"
    found = f"{seen}; the chapters use {used} workers ({why}), fewer where the work has fewer shards or batches"
    if used >= MIN_CORES:
        return Result("cores", True, found)
    if f.cores >= MIN_CORES:
        return Result("cores", False, f"{found}; the course compares 0, 1 and 2 workers",
                      f"raise the cap: `make configure PACKLAB_CORES={min(f.cores, 2)}` (or `make configure PACKLAB_CORES=` "
                      "to use every core)")
    return Result("cores", False, f"{found}; the course compares 0, 1 and 2 workers",
                  "use a machine with at least 2 cores; on a cluster or hub ask for 2 CPUs per attendee "
                  "(e.g. `salloc --cpus-per-task=2`)")


def check_memory(f: Facts) -> Result:
    if f.memory_bytes is None:
        return Result("memory", True, "could not be determined here (not checked)")
    gib = f.memory_bytes / 2**30
    if gib >= MIN_MEMORY_GIB:
        return Result("memory", True, f"{gib:.1f} GiB (the course needs {MIN_MEMORY_GIB:g} GiB)")
    todo = "close other programs, or use a machine with more memory; shut down each chapter's kernel when you leave it"
    if f.wsl:
        todo = "WSL2 gets half of Windows' memory by default: raise `memory=` in %UserProfile%\\.wslconfig, then `wsl --shutdown`"
    return Result("memory", False, f"{gib:.1f} GiB; the course needs {MIN_MEMORY_GIB:g} GiB", todo)


def check_disk(f: Facts) -> Result:
    need = f.disk_needed_bytes / 1e9
    if f.free_disk_bytes is None:
        return Result("free disk", True, f"could not be determined at {f.data_root} (not checked; the course writes {need:.1f} GB more)")
    free = f.free_disk_bytes / 1e9
    if f.free_disk_bytes >= f.disk_needed_bytes:
        return Result("free disk", True, f"{free:.1f} GB free at {f.data_root}; the course will write {need:.1f} GB more there")
    return Result(
        "free disk", False, f"{free:.1f} GB free at {f.data_root}, but the course will write {need:.1f} GB more there",
        f"free some space, put the data elsewhere (`make configure {paths.DATA_ENV_VAR}=/bigger/disk/packed-data`), "
        f"or use the small-data mode (`make configure PACKLAB_COUNT=2000`); `make clean-packed` removes the packed copies",
    )


def check_shm(f: Facts) -> Result:
    if f.shm_bytes is None:
        if f.platform == "linux":
            return Result("/dev/shm", False, "missing: DataLoader workers cannot hand batches over",
                          "mount a tmpfs on /dev/shm (in a container: `docker run --shm-size=2g`)")
        return Result("/dev/shm", True, "not used on this system (workers use the system's shared memory)")
    mib = f.shm_bytes / 2**20
    if mib >= MIN_SHM_MIB:
        return Result("/dev/shm", True, f"{mib:,.0f} MiB")
    return Result(
        "/dev/shm", False, f"only {mib:,.0f} MiB: DataLoader workers fail with 'Bus error' or 'No space left on device'",
        "Docker: `docker run --shm-size=2g ...`; Kubernetes/JupyterHub: mount an emptyDir with `medium: Memory` "
        "at /dev/shm (see the setup page)",
    )


def check_start_methods(f: Facts) -> Result:
    methods = ", ".join(f.start_methods)
    if "fork" not in f.start_methods:
        return Result("start methods", False, f"{methods}: no fork, which chapters 3 to 10 use",
                      "on Windows, work in WSL2 (see the setup page); elsewhere use Linux or macOS")
    if f.platform == "darwin":
        return Result("start methods", True, f"{methods} (spawn is macOS's default; the fork cells usually run, "
                                             "but Python calls fork unsafe on macOS: see the setup page)")
    return Result("start methods", True, methods)


def check_jupyterlab(f: Facts) -> Result:
    missing = [dist for module, dist in LAB_PACKAGES.items() if f.packages.get(dist) is None]
    absent = [name for name, present in f.lab_extensions.items() if not present]
    if not missing and not absent:
        found = ", ".join(f"{dist} {f.packages[dist]}" for dist in LAB_PACKAGES.values() if dist != "ipykernel")
        return Result("JupyterLab", True, found)
    problems = [f"{dist} is not installed" for dist in missing]
    problems += [f"the {name} extension is missing ({LAB_EXTENSIONS[name]} only with it)" for name in absent if name in LAB_EXTENSIONS]
    return Result("JupyterLab", False, "; ".join(problems),
                  "run `make setup`; on a JupyterHub the admin installs jupytext and jupyterlab-myst into the hub's "
                  "JupyterLab (see the setup page)")


def check_data(f: Facts) -> Result:
    if f.count_setting:
        return Result("data", False, f.count_setting,
                      "unset PACKLAB_COUNT, or set it to a number such as 2000: `make configure PACKLAB_COUNT=2000`")
    if f.data_unverified:
        return Result("data", False, f"found under {f.data_root}, but this Python cannot verify it",
                      "run `make setup`, then `make doctor` (it verifies every file)")
    if f.data_count is None:
        return Result("data", False, f"not generated yet under {f.data_root}",
                      "run `make data` (about half a minute on two cores; `make doctor` does it first), "
                      "or `make configure PACKLAB_COUNT=2000` first for the small-data mode")
    if f.data_problems:
        shown = "; ".join(f.data_problems[:3]) + (f" (and {len(f.data_problems) - 3} more)" if len(f.data_problems) > 3 else "")
        return Result("data", False, f"does not match its manifest: {shown}",
                      "regenerate it: `python -m packlab.data --force` (about half a minute)")
    if f.data_count != f.expected_count:
        return Result("data", False, f"{f.data_count} images under {f.data_root}, but the course is set to {f.expected_count}",
                      f"record the size you have: `make configure PACKLAB_COUNT={f.data_count}`; "
                      f"or generate {f.expected_count}: `make data`")
    mode = " (small-data mode)" if f.expected_count < 10_000 else ""
    return Result("data", True, f"{f.data_count:,} images{mode} under {f.data_root}, every file matching its manifest")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _setting(f: Facts, name: str) -> str | None:
    return next((s.value for s in f.settings if s.name == name), None)


def check_uv(f: Facts) -> Result:
    least = ".".join(map(str, MIN_UV))
    if f.uv_version is None:
        return Result("uv", True, "not on PATH (make setup installs one into .tools/ when it needs it; "
                                  "a conda environment needs none)")
    version = ".".join(map(str, f.uv_version))
    if f.uv_version >= MIN_UV:
        return Result("uv", True, f"{version} ({f.uv_path})")
    return Result(
        "uv", False, f"{version} ({f.uv_path}) is older than {least}, whose --torch-backend is more than a preview: "
                     "an older uv may ignore TORCH_BACKEND without a word and install PyPI's torch with 3.6 GB of "
                     "CUDA libraries",
        "update it: `uv self update` (or `pip install --upgrade uv`); or take it off PATH, and `make setup` "
        "installs a current one into .tools/")


def check_settings(f: Facts) -> Result:
    if f.settings_problem:
        return Result("settings", False, f.settings_problem,
                      "rewrite it with `make configure NAME=value` (delete the file first), or delete it")
    shown = ", ".join(f"{s.name}={s.value} ({s.origin})" for s in f.settings)
    return Result("settings", True, shown or "none")


def check_workers(f: Facts) -> Result:
    if f.worker_trials is None:
        return Result("DataLoader workers", False, "not tried: torch is not installed here (see the environment line)",
                      "run `make setup`, then `make doctor` again")
    shown = ", ".join(f"{t.method} {t.seconds:.1f} s" if t.ok else f"{t.method} FAILED" for t in f.worker_trials)
    found = f"64 images through DataLoader(num_workers=2): {shown}"
    failed = [t for t in f.worker_trials if not t.ok]
    if not failed:
        return Result("DataLoader workers", True, found)
    todo = []
    for trial in failed:
        if trial.timed_out:
            todo.append(f"{trial.method}: no batch within the time limit. A loaded machine (a login node?) or a hung "
                        "worker: on a cluster run on a compute node (`salloc`, see the setup page); else rerun, "
                        "and send this output to your instructor if it repeats")
        elif any(word in trial.error for word in ("Bus error", "No space left", "shm", "shared memory")):
            todo.append(f"{trial.method}: {trial.error} - /dev/shm is too small: `docker run --shm-size=2g`, or "
                        "an emptyDir with `medium: Memory` at /dev/shm (see the setup page)")
        elif trial.method == "fork" and f.platform == "darwin":
            todo.append(f"fork: {trial.error} - Python calls fork unsafe on macOS; the chapters' fork cells may crash "
                        "the same way: rerun them, or follow those sections on the projector (see the setup page)")
        else:
            todo.append(f"{trial.method}: {trial.error} - send this output to your instructor")
    return Result("DataLoader workers", False, found, "\n".join(todo))


def check_location(f: Facts) -> Result:
    windows = [f"{what} {where}" for what, where in (("the clone", f.repo_root), ("the data", f.data_root))
               if f.wsl and str(where).startswith(WSL_WINDOWS_DRIVES)]
    if not windows:
        return Result("location", True, f"the clone at {f.repo_root}")
    return Result(
        "location", False, f"{' and '.join(windows)} on a Windows drive: WSL reaches those files through a network "
                           "protocol, many times slower to open, which is what the course measures",
        "clone into your Linux home folder (`cd ~ && git clone ...`) and work there; put the data there too "
        "(`make configure PACKLAB_DATA=~/packed-data`, or leave it unset)")


def check_pyspy(f: Facts) -> Result:
    """Whether py-spy can attach to a running process. Never ✗: chapter 11 falls back where it cannot."""
    if f.pyspy is None:
        return Result("py-spy", True, "not tried")
    if f.pyspy.attached:
        return Result("py-spy", True, "can attach to a running process here (chapter 11 profiles its job live)")
    if f.platform == "darwin":
        how = "to attach, run JupyterLab or the job with `sudo`"
    elif "ptrace_scope is" in f.pyspy.permission:
        how = ("to attach, `sudo sysctl kernel.yama.ptrace_scope=0` (until the next reboot), or run py-spy with `sudo`; "
               "in a container, start it with --cap-add SYS_PTRACE")
    else:
        how = "to attach, run py-spy with `sudo`, or start a container with --cap-add SYS_PTRACE"
    return Result("py-spy", True, f"cannot attach to a running process here ({f.pyspy.said}; {f.pyspy.permission}). "
                                  f"Not needed: chapter 11 then starts its job under py-spy, or samples the work "
                                  f"itself; {how}")


CHECKS = (check_python, check_uv, check_settings, check_environment, check_kernel, check_cores, check_memory,
          check_disk, check_shm, check_start_methods, check_workers, check_location, check_jupyterlab, check_data,
          check_pyspy)


def run_checks(facts: Facts) -> list[Result]:
    """Every check on ``facts``, in the order of the report."""
    return [check(facts) for check in CHECKS]


def report(results: list[Result]) -> str:
    """The report :func:`main` prints: a line per check, what to do under each ✗, a verdict."""
    lines = ["Is this machine ready for the course? (python -m packlab.course.doctor)"]
    for result in results:
        lines += result.lines()
    failed = [r.name for r in results if not r.ok]
    if failed:
        lines.append(f"NOT READY: {len(failed)} check(s) failed ({', '.join(failed)}). Fix each ✗ as it says, "
                     "then run `make doctor` again.")
    else:
        lines.append("READY: every check passed.")
    return "\n".join(lines)


