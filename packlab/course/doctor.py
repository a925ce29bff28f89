"""Is this machine ready for the course? A go/no-go check, one line per need (``make doctor``).

::

    make doctor                         # after make setup; or, without make:
    python -m packlab.course.doctor     # from the repository root, in the course's environment
    python3 -m packlab.course.doctor    # also works with a bare python3, before make setup
    python -m packlab.course.doctor --sizes   # what each part of the environment takes on disk

Each line is ✓ (fine) or ✗ (the course will fail or mislead here), and a ✗ says what to
do. The exit status is 0 when nothing is ✗. What is checked, and why:

* **Python** 3.10 or newer (``pyproject.toml`` requires it; macOS's own ``python3`` is 3.9);
* **the environment**: the pinned torch and torchvision import, from this repository's
  environment, and the kernel JupyterLab starts for the notebooks runs that same Python
  (a ``python3`` kernel registered in the home folder can point elsewhere);
* **cores**: at least :data:`MIN_CORES` this process may use (CPU affinity and container
  limits count): with one core, "two workers" measure nothing;
* **memory**: at least :data:`MIN_MEMORY_GIB` GiB, the smaller of the machine's and a
  container's limit (a JupyterHub pod's);
* **free disk** at the data root, against what the course will still write there: the
  dataset if it is not generated yet, and the packed copies the chapters write
  (:func:`packlab.course.footprint.disk_needed`);
* **/dev/shm**: DataLoader workers hand batches over through it; Docker and Kubernetes
  give 64 MB unless told otherwise;
* **start methods**: chapters 3 to 10 ask for ``fork``; Windows has none;
* **JupyterLab** with jupytext (a ``.md`` chapter opens as a notebook) and
  jupyterlab-myst (the ``{eval}`` numbers in the prose render), both lab extensions present;
* **the data**: generated, every file matching its manifest, at the size the course is
  set to (``PACKLAB_COUNT``, small-data mode, see :mod:`packlab.data`).

Every check is a function of a :class:`Facts` record, so the tests fake any machine;
:func:`gather` collects the facts of this one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from packlab import paths
from packlab.course import footprint
from packlab.course.footprint import MEAN_JPEG_BYTES, disk_needed, pinned_versions

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
class Facts:
    """What the checks look at. :func:`gather` fills it for this machine; tests fake it."""

    python: tuple[int, int, int]
    platform: str  # sys.platform: linux, darwin, win32
    machine: str  # platform.machine(): x86_64, arm64, ...
    cores: int
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
    build = " (CPU-only build)" if "+cpu" in torch else " (CUDA build: its libraries take GBs the course does not use)" if "+cu" in torch else ""
    return Result("environment", True, f"torch {torch}{build}, torchvision {f.packages['torchvision']}, in {f.executable}")


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
    if f.cores >= MIN_CORES:
        return Result("cores", True, f"{f.cores} available to this process")
    return Result("cores", False, f"only {f.cores} core available to this process; the course compares 0, 1 and 2 workers",
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
        f"free some space, put the data elsewhere (`export {paths.DATA_ENV_VAR}=/bigger/disk/packed-data`), "
        f"or use the small-data mode (`export PACKLAB_COUNT=2000`); `make clean-packed` removes the packed copies",
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
        return Result("data", False, f.count_setting, "unset PACKLAB_COUNT, or set it to a number such as 2000")
    if f.data_unverified:
        return Result("data", False, f"found under {f.data_root}, but this Python cannot verify it",
                      "run `make setup`, then `make doctor` (it verifies every file)")
    if f.data_count is None:
        return Result("data", False, f"not generated yet under {f.data_root}",
                      "run `make data` (about half a minute on two cores; 2,000 images with PACKLAB_COUNT=2000)")
    if f.data_problems:
        shown = "; ".join(f.data_problems[:3]) + (f" (and {len(f.data_problems) - 3} more)" if len(f.data_problems) > 3 else "")
        return Result("data", False, f"does not match its manifest: {shown}",
                      "regenerate it: `python -m packlab.data --force` (about half a minute)")
    if f.data_count != f.expected_count:
        return Result("data", False, f"{f.data_count} images under {f.data_root}, but the course is set to {f.expected_count}",
                      "run `make data` to generate them, or set PACKLAB_COUNT to the size you have")
    mode = " (small-data mode)" if f.expected_count < 10_000 else ""
    return Result("data", True, f"{f.data_count:,} images{mode} under {f.data_root}, every file matching its manifest")


CHECKS = (check_python, check_environment, check_kernel, check_cores, check_memory, check_disk, check_shm,
          check_start_methods, check_jupyterlab, check_data)


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


# ----------------------------------------------------------------- facts of this machine


def _folder_bytes(folder: Path) -> int:
    total = 0
    for base, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def memory_bytes() -> int | None:
    """The memory this process may use: the machine's, or a container's (cgroup) limit when smaller."""
    total = None
    try:
        meminfo = Path("/proc/meminfo").read_text()
        total = int(re.search(r"MemTotal:\s+(\d+) kB", meminfo).group(1)) * 1024
    except (OSError, AttributeError):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
    return total


def _installed(names) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _kernel_python() -> str | None:
    """The Python the notebooks' ``python3`` kernel runs, as the JupyterLab attendees use would start it.

    That is ``make lab``'s JupyterLab, from this environment; on a JupyterHub (where
    ``JUPYTERHUB_USER`` is set) it is the hub's own, whose ``jupyter`` is first on PATH.
    """
    if os.environ.get("JUPYTERHUB_USER") and shutil.which("jupyter"):
        return _hub_kernel_python(shutil.which("jupyter"))
    if importlib.util.find_spec("jupyter_client") is None:
        return None
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return None
    command = spec.argv[0] if spec.argv else ""
    # jupyter_client runs the server's own Python for a kernelspec that says just "python".
    if command in {"python", f"python{sys.version_info[0]}", f"python{sys.version_info[0]}.{sys.version_info[1]}"}:
        return sys.executable
    return command


def _hub_kernel_python(jupyter: str) -> str | None:
    """The Python of the ``python3`` kernel the ``jupyter`` command's server would start."""
    import subprocess

    try:
        listed = subprocess.run([jupyter, "kernelspec", "list", "--json"], capture_output=True, text=True, timeout=60)
        spec = json.loads(listed.stdout)["kernelspecs"]["python3"]["spec"]
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        return None
    command = spec["argv"][0]
    if command.startswith("python"):  # the server's own Python: the one in the jupyter command's first line
        try:
            first = Path(jupyter).read_text(errors="replace").splitlines()[0]
        except (OSError, IndexError):
            return command
        return first[2:].strip() if first.startswith("#!") else command
    return command


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _data_facts(root: Path) -> tuple[int | None, tuple[str, ...], int, str | None, int]:
    """(images in the manifest or None, problems, expected count, a bad PACKLAB_COUNT's message, dataset bytes)."""
    from packlab import data

    try:
        expected = data.default_count()
        bad_setting = None
    except ValueError as exc:
        expected, bad_setting = data.DEFAULT_COUNT, str(exc)
    if not paths.manifest_path(root).is_file():
        return None, (), expected, bad_setting, 0
    report = data.verify(root)
    try:
        manifest = data.load_manifest(root)
    except data.DatasetError:
        return None, tuple(report.problems), expected, bad_setting, 0
    return len(manifest), tuple(report.problems), expected, bad_setting, sum(s.bytes for s in manifest)


def gather(root: Path | None = None) -> Facts:
    """The facts of this machine and this Python."""
    import multiprocessing

    root = root or paths.repo_root()
    data_root = paths.data_root()
    pins = pinned_versions(root)
    packages = _installed(sorted(set(pins) | {"torch", "torchvision"} | set(LAB_PACKAGES.values())))
    numpy_here = packages.get("numpy") is not None and packages.get("pillow") is not None
    if numpy_here:
        count, problems, expected, bad_setting, dataset_bytes = _data_facts(data_root)
    else:  # a bare python3 before `make setup`: the data cannot be read yet
        count, problems, expected, bad_setting, dataset_bytes = None, (), 10_000, None, 0
    packed = paths.packed_dir(data_root)
    have_packed = _folder_bytes(packed) if packed.is_dir() else 0
    mean = dataset_bytes / count if count else MEAN_JPEG_BYTES
    try:
        free = shutil.disk_usage(_existing_ancestor(data_root)).free
    except OSError:
        free = None
    try:
        shm = shutil.disk_usage("/dev/shm").total if Path("/dev/shm").is_dir() else None
    except OSError:
        shm = None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    share = Path(sys.prefix) / "share" / "jupyter" / "labextensions"
    return Facts(
        python=tuple(sys.version_info[:3]),
        platform=sys.platform,
        machine=platform.machine(),
        cores=cores,
        memory_bytes=memory_bytes(),
        data_root=data_root,
        free_disk_bytes=free,
        disk_needed_bytes=disk_needed(expected, dataset_bytes if count == expected and not problems else 0, have_packed, mean),
        shm_bytes=shm,
        start_methods=tuple(multiprocessing.get_all_start_methods()),
        packages=packages,
        pins=pins,
        lab_extensions={name: (share / name / "package.json").is_file() for name in LAB_EXTENSIONS},
        executable=sys.executable,
        kernel_python=_kernel_python(),
        data_count=count,
        data_problems=problems,
        expected_count=expected,
        count_setting=bad_setting,
        data_unverified=not numpy_here and paths.manifest_path(data_root).is_file(),
        wsl=sys.platform == "linux" and "microsoft" in platform.release().lower(),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", action="store_true", help="instead: what each part of the environment takes on disk")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.sizes:
        print(footprint.sizes_report(footprint.environment_costs()))
        return 0
    results = run_checks(gather())
    if args.json:
        print(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        print(report(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
