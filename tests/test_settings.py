"""One settings file for make and packlab, and a Makefile that installs and regenerates only when it must.

The tests that run ``make`` do it in a copy of the course's machinery (Makefile,
pyproject.toml, packlab/, the exercises and the JupyterLab settings) whose environment is
a *view* of this one: a folder with its own ``pyvenv.cfg`` and stamps whose ``lib/`` is
this environment's, so nothing here is reinstalled or restamped. A fake ``uv`` first on
PATH records every call: the tests can say that nothing was installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from packlab import data, paths, settings

SETTING_VARIABLES = ("PACKLAB_COUNT", "PACKLAB_DATA", "VENV", "TORCH_BACKEND", "PACKLAB_SETTINGS", "PYTHON",
                     "MAKEFLAGS", "MAKELEVEL")


@pytest.fixture
def settings_file(tmp_path, monkeypatch):
    path = tmp_path / "settings.mk"
    monkeypatch.setenv(settings.SETTINGS_ENV_VAR, str(path))
    for name in settings.KNOWN:
        monkeypatch.delenv(name, raising=False)
    return path


# ------------------------------------------------------------------------------ the file


def test_written_settings_are_read_back_with_their_source(settings_file, tmp_path):
    settings.write({"PACKLAB_COUNT": "2000", "PACKLAB_DATA": str(tmp_path / "scratch")})
    assert settings.lookup("PACKLAB_COUNT") == settings.Setting("PACKLAB_COUNT", "2000", str(settings_file))
    assert data.default_count() == 2000 and data.count_setting().source == str(settings_file)
    assert paths.data_root() == (tmp_path / "scratch").resolve()
    assert "PACKLAB_COUNT ?= 2000" in settings_file.read_text()  # make's ?=: the environment wins there too


def test_the_environment_wins_over_the_file(settings_file, monkeypatch):
    settings.write({"PACKLAB_COUNT": "2000"})
    monkeypatch.setenv("PACKLAB_COUNT", "3000")
    assert data.default_count() == 3000 and data.count_setting().source == "environment"


def test_an_empty_value_removes_a_setting_and_folders_become_absolute(settings_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings.write({"PACKLAB_COUNT": "2000", "VENV": "venvs/course"})
    assert settings.read_file()["VENV"] == str(tmp_path / "venvs" / "course")
    settings.write({"PACKLAB_COUNT": ""})
    assert "PACKLAB_COUNT" not in settings.read_file() and data.default_count() == data.DEFAULT_COUNT


def test_a_line_that_is_not_a_setting_names_the_file_and_the_line(settings_file):
    settings_file.write_text("# comment\n\nPACKLAB_COUNT ?= 2000\nCOUNT = 2000\n")
    with pytest.raises(settings.SettingsError) as raised:
        settings.read_file()
    assert str(settings_file) in str(raised.value) and "line 4" in str(raised.value) and "make configure" in str(raised.value)
    with pytest.raises(settings.SettingsError, match="unknown setting"):
        settings.write({"COUNT": "2"})


def test_a_bad_count_in_the_file_says_where_it_is(settings_file):
    settings.write({"PACKLAB_COUNT": "lots"})
    with pytest.raises(ValueError) as raised:
        data.default_count()
    assert "PACKLAB_COUNT='lots'" in str(raised.value) and str(settings_file) in str(raised.value)


def test_ensure_keeps_a_dataset_of_another_size_when_no_count_is_set(settings_file, small_root, tmp_path, capsys):
    root = tmp_path / "copy"
    shutil.copytree(small_root, root)
    before = paths.manifest_path(root).stat().st_mtime_ns
    data.ensure(root, seed=7, progress=False)  # no count anywhere: the default 10,000 would regenerate
    assert paths.manifest_path(root).stat().st_mtime_ns == before
    said = capsys.readouterr().err
    assert "kept" in said and "make configure PACKLAB_COUNT=60" in said


# ------------------------------------------------------------------------- make, in a copy


def _fake_uv(folder: Path, version: str = "0.13.9") -> Path:
    """A uv that records its arguments (and UV_TORCH_BACKEND) in calls.log; `uv venv` makes a real venv."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "calls.log"
    script = folder / "uv"
    script.write_text(f"""#!/bin/sh
echo "$@ UV_TORCH_BACKEND=${{UV_TORCH_BACKEND:-}}" >> {log}
case "$1" in
  --version) echo "uv {version} (fake)";;
  venv) eval last=\\${{$#}}; {sys.executable} -m venv --without-pip "$last";;
esac
""")
    script.chmod(0o755)
    return log


@pytest.fixture
def course_copy(tmp_path):
    """The course's machinery in tmp_path/course, its environment a view of this one at tmp_path/venv."""
    root = paths.repo_root()
    copy = tmp_path / "course"
    copy.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(root / name, copy / name)
    for name in ("packlab", "exercises", "jupyterlab-settings"):
        shutil.copytree(root / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.ipynb"))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy2(Path(sys.prefix) / "pyvenv.cfg", venv / "pyvenv.cfg")
    (venv / "bin" / "python").symlink_to(Path(sys.prefix) / "bin" / "python")
    (venv / "lib").symlink_to(Path(sys.prefix) / "lib")
    return copy


def make(copy: Path, *args: str, path_first: Path | None = None, timeout: float = 300, **env_extra):
    """``make`` in ``copy`` as a new terminal would run it: no course setting exported."""
    env = {k: v for k, v in os.environ.items() if k not in SETTING_VARIABLES}
    env["PATH"] = f"{path_first}:{env['PATH']}" if path_first else env["PATH"]
    env.update(env_extra)
    return subprocess.run(["make", "--no-print-directory", *args], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_configure_writes_the_file_make_and_packlab_read(course_copy, tmp_path):
    done = make(course_copy, "configure", "PACKLAB_COUNT=2000", f"PACKLAB_DATA={tmp_path / 'scratch'}")
    assert done.returncode == 0, done.stderr
    written = settings.read_file(course_copy / "settings.mk")
    assert written == {"PACKLAB_COUNT": "2000", "PACKLAB_DATA": str(tmp_path / "scratch")}
    assert f"PACKLAB_COUNT=2000 (from {course_copy / 'settings.mk'})" in done.stdout
    shown = make(course_copy, "-s", "--eval=show: ; @echo $(PACKLAB_COUNT) $(PACKLAB_DATA) $(VENV)", "show")
    assert shown.stdout.split() == ["2000", str(tmp_path / "scratch"), ".venv"]


def test_a_new_shell_with_only_the_settings_file_regenerates_and_moves_nothing(course_copy, tmp_path):
    """Acceptance: `make data` and `make lab` in a new terminal find count, data folder and environment in the file."""
    data_root = tmp_path / "scratch"
    (course_copy / "settings.mk").write_text(
        f"PACKLAB_COUNT ?= {data.MIN_COUNT}\nPACKLAB_DATA ?= {data_root}\nVENV ?= {tmp_path / 'venv'}\n")
    calls = _fake_uv(tmp_path / "fake-bin")
    first = make(course_copy, "data", path_first=tmp_path / "fake-bin")
    assert first.returncode == 0, first.stdout + first.stderr
    assert len(data.load_manifest(data_root)) == data.MIN_COUNT
    generated = paths.manifest_path(data_root).stat().st_mtime_ns
    (course_copy / "pyproject.toml").touch()  # a release that touched pyproject.toml: nothing to install either
    again = make(course_copy, "data", path_first=tmp_path / "fake-bin")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to do" in again.stdout and "nothing to install" in again.stdout
    lab = make(course_copy, "lab", "LAB_ARGS=--setup-only", path_first=tmp_path / "fake-bin")
    assert lab.returncode == 0, lab.stdout + lab.stderr
    assert paths.manifest_path(data_root).stat().st_mtime_ns == generated
    assert not (course_copy / "data").exists() and not (course_copy / ".venv").exists()
    assert (course_copy / "mywork" / "exercises" / "01_jpeg_dataset.md").is_file()
    assert not calls.exists(), "make called uv: " + calls.read_text()


def test_a_count_forgotten_in_a_new_shell_keeps_the_dataset(course_copy, tmp_path):
    data_root = tmp_path / "scratch"
    (course_copy / "settings.mk").write_text(f"PACKLAB_DATA ?= {data_root}\nVENV ?= {tmp_path / 'venv'}\n")
    first = make(course_copy, "data", PACKLAB_COUNT=str(data.MIN_COUNT))  # set in one terminal only
    assert first.returncode == 0, first.stderr
    generated = paths.manifest_path(data_root).stat().st_mtime_ns
    forgot = make(course_copy, "data")
    assert forgot.returncode == 0, forgot.stderr
    assert paths.manifest_path(data_root).stat().st_mtime_ns == generated
    assert "kept" in forgot.stderr and f"make configure PACKLAB_COUNT={data.MIN_COUNT}" in forgot.stderr


def test_a_python_too_old_stops_before_uv_with_the_doctors_advice(course_copy, tmp_path):
    old = tmp_path / "fake-bin" / "python3.9"
    calls = _fake_uv(old.parent)
    # -c: the version test fails, as on 3.9; -m packlab.course.doctor --only Python: the advice.
    old.write_text("#!/bin/sh\ncase \"$1\" in -c) exit 1;; -m) echo '  ✗ Python: 3.9.6 is too old (fake)';; esac\n")
    old.chmod(0o755)
    done = make(course_copy, "setup", f"VENV={tmp_path / 'new-venv'}", f"PYTHON={old}", path_first=old.parent)
    assert done.returncode != 0
    assert "Python: 3.9.6 is too old" in done.stdout + done.stderr
    assert "venv" not in (calls.read_text() if calls.exists() else "")


def test_an_old_uv_stops_the_setup_with_what_to_do(course_copy, tmp_path):
    calls = _fake_uv(tmp_path / "fake-bin", version="0.6.3")
    done = make(course_copy, "setup", f"VENV={tmp_path / 'new-venv'}", path_first=tmp_path / "fake-bin")
    assert done.returncode != 0 and "older than 0.7.14" in done.stderr and "uv self update" in done.stderr
    assert calls.read_text().split("\n")[0].startswith("--version") and "venv" not in calls.read_text()


def _serve(folder: Path):
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("reachable", [True, False], ids=["cpu index reachable", "cpu index unreachable"])
def test_the_cpu_backend_is_used_where_its_index_answers_else_the_fallback_is_said_and_recorded(course_copy, tmp_path,
                                                                                                 reachable):
    index = tmp_path / "index"
    (index / "cpu" / "torch").mkdir(parents=True)
    (index / "cpu" / "torch" / "index.html").write_text("<html></html>")
    server = _serve(index)
    url = f"http://127.0.0.1:{server.server_address[1]}" if reachable else "http://127.0.0.1:9"  # port 9: nobody
    calls = _fake_uv(tmp_path / "fake-bin")
    venv = tmp_path / "new-venv"
    try:
        done = make(course_copy, "setup", f"VENV={venv}", "TORCH_BACKEND=cpu", path_first=tmp_path / "fake-bin",
                    PACKLAB_TORCH_INDEX=url)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stdout + done.stderr
    installs = [line for line in calls.read_text().splitlines() if line.startswith("pip install") and " -e ." in line]
    record = (venv / ".torch-backend").read_text()
    if reachable:
        assert installs[0].endswith("UV_TORCH_BACKEND=cpu") and record.strip() == "cpu"
        assert "NOTE" not in done.stdout
    else:
        assert installs[0].endswith("UV_TORCH_BACKEND=") and record.startswith("pypi: fallback from cpu")
        assert "not reachable" in done.stdout and "3.6 GB" in done.stdout  # said, not silent


def test_a_conda_environment_is_checked_never_installed_into(course_copy, tmp_path):
    conda = tmp_path / "conda-env"  # an environment without the course's packages, marked as conda's
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(conda)], check=True, timeout=120)
    (conda / "conda-meta").mkdir()
    calls = _fake_uv(tmp_path / "fake-bin")
    done = make(course_copy, "setup", f"VENV={conda}", path_first=tmp_path / "fake-bin")
    assert done.returncode != 0
    assert "conda env update -f environment.yml" in done.stdout and "pip install --no-deps mosaicml-streaming" in done.stdout
    assert not calls.exists()
