"""The facts of this machine, for the doctor's checks (:mod:`packlab.course.doctor.checks`).

:func:`gather` looks at this Python, this machine and this checkout: versions, cores,
memory, disk, ``/dev/shm``, the kernel JupyterLab would start, uv, the course's settings
and where each came from, the data, and a short trial of DataLoader workers under each
start method (:mod:`packlab.course.doctor.workers`). It runs with a bare ``python3``
too, before ``make setup``: what needs the environment is then left out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from packlab import cpus, paths, settings
from packlab.course.doctor.checks import LAB_EXTENSIONS, LAB_PACKAGES, Facts, PyspyTrial, SettingLine
from packlab.course.footprint import MEAN_JPEG_BYTES, disk_needed, pinned_versions


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


def uv_facts(root: Path) -> tuple[tuple[int, ...] | None, str]:
    """(uv's version, its path): the uv the Makefile would use, from PATH or ``.tools/``; (None, "") if none."""
    uv = shutil.which("uv") or str(root / ".tools" / "bin" / "uv")
    if not os.access(uv, os.X_OK):
        return None, ""
    try:
        out = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None, ""
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return (tuple(int(part) for part in match.groups()) if match else None), uv


def settings_facts() -> tuple[tuple[SettingLine, ...], str | None]:
    """Every course setting with where its value came from, and a settings file's problem (None: fine)."""
    try:
        settings.read_file()
    except settings.SettingsError as exc:
        return (), str(exc)
    origins = {"environment": "the environment", "default": "the default"}
    lines = []
    for name in settings.KNOWN:
        found = settings.lookup(name, settings.DEFAULTS[name])
        lines.append(SettingLine(name, found.value, origins.get(found.source, Path(found.source).name)))
    return tuple(lines), None


@contextmanager
def _without_broken_settings(problem: str | None):
    """Look at everything else as if there were no settings file when that file cannot be read."""
    if problem is None:
        yield
        return
    saved = os.environ.get(settings.SETTINGS_ENV_VAR)
    os.environ[settings.SETTINGS_ENV_VAR] = os.devnull + ".absent"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[settings.SETTINGS_ENV_VAR]
        else:
            os.environ[settings.SETTINGS_ENV_VAR] = saved


def has_nvidia_gpu() -> bool:
    """Whether an NVIDIA driver is loaded (what PyPI's CUDA build of torch would need to be of use)."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def torch_cuda() -> str | None:
    """The CUDA version torch was built for (``torch.version.cuda``), read from ``torch/version.py``
    without importing torch (seconds); None for a CPU-only build or no torch."""
    try:
        spec = importlib.util.find_spec("torch")
        text = (Path(spec.origin).parent / "version.py").read_text()
    except (ImportError, AttributeError, TypeError, OSError):
        return None
    match = re.search(r"^cuda\b[^=]*=\s*'([^']+)'", text, flags=re.M)
    return match.group(1) if match else None


def torch_record() -> str | None:
    """What ``make setup`` wrote into ``<environment>/.torch-backend`` about torch's build, or None."""
    try:
        return (Path(sys.prefix) / ".torch-backend").read_text().strip() or None
    except OSError:
        return None


def gather(root: Path | None = None, try_workers: bool = True) -> Facts:
    """The facts of this machine and this Python; ``try_workers=False`` skips the DataLoader trial."""
    setting_lines, settings_problem = settings_facts()
    with _without_broken_settings(settings_problem):
        return _gather(root or paths.repo_root(), try_workers, setting_lines, settings_problem)


def _gather(root: Path, try_workers: bool, setting_lines, settings_problem) -> Facts:
    import multiprocessing

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
    cores, course_cores, cores_problem = cpus.visible_cores(), None, None
    cap = cpus.cores_cap()
    try:
        course_cores = cpus.course_cores()
    except settings.SettingsError as exc:
        cores_problem = str(exc)
    emulated = os.environ.get(cpus.EMULATED_CORES_VAR, "").strip()
    start_methods = tuple(multiprocessing.get_all_start_methods())
    trials = None
    if try_workers and numpy_here and packages.get("torch") is not None:
        from packlab.course.doctor import workers

        trials = workers.run_trials([m for m in ("fork", "spawn") if m in start_methods])
    pyspy = None
    if try_workers:
        from packlab import profiling  # standard library only at import: runs before make setup too

        attached, said = profiling.attach_trial(timeout=3)
        # ptrace_permission ends with advice (". Run py-spy with sudo..."); the check gives its own
        pyspy = PyspyTrial(attached, said, profiling.ptrace_permission().split(". Run ")[0])
    uv_version, uv_path = uv_facts(root)
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
        start_methods=start_methods,
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
        repo_root=root,
        uv_version=uv_version,
        uv_path=uv_path,
        settings=setting_lines,
        settings_problem=settings_problem,
        gpu=has_nvidia_gpu(),
        torch_cuda=torch_cuda(),
        torch_record=torch_record(),
        worker_trials=trials,
        course_cores=course_cores,
        cores_origin=cap.origin(),
        cores_problem=cores_problem,
        real_cores=cpus.affinity_cores() if emulated else None,
        pyspy=pyspy,
    )
