"""``make test``'s phases: an empty phase fails, except the serial one; the unit and browser phases run together."""

import pytest

from packlab.course import testrun


class FakeProcess:
    def __init__(self, status):
        self.status = status

    def wait(self):
        return self.status


@pytest.fixture
def fake_phases(monkeypatch, tmp_path):
    monkeypatch.setattr(testrun.paths, "build_dir", lambda: tmp_path)
    monkeypatch.setattr(testrun.paths, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(testrun, "convert_notebooks", lambda root, out_dir=None: [])
    started = []

    def use(empty=None, core_reads="chapters/01_jpeg_files\n"):
        commands = testrun.phase_commands(4, 600, [])

        def fake_popen(command, cwd, stdout=None, stderr=None, env=None):
            phase = next(p for p, c in commands.items() if c == command)
            started.append(phase)
            if phase == "notebooks-16-cores-no-ptrace" and core_reads is not None:
                (tmp_path / testrun.CORE_READS_LOG).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / testrun.CORE_READS_LOG).write_text(core_reads)
            return FakeProcess(testrun.NO_TESTS_COLLECTED if phase == empty else 0)

        monkeypatch.setattr(testrun.subprocess, "Popen", fake_popen)
        return started

    return use


@pytest.mark.parametrize("empty, expected", [("serial", 0), ("unit", 1), ("notebooks", 1), ("browser", 1),
                                             ("notebooks-8-cores-user", 1), ("notebooks-16-cores-no-ptrace", 1)])
def test_a_phase_that_collects_nothing_fails_unless_it_may_be_empty(fake_phases, tmp_path, empty, expected):
    fake_phases(empty)
    assert testrun.run(list(testrun.PHASES), jobs=4, cell_timeout=600, extra=[]) == expected
    assert (tmp_path / "test-times.json").exists()


def test_the_machine_is_alone_for_serial_tests_and_notebooks_and_shared_by_unit_and_browser_tests():
    assert testrun.STAGES == (("serial",), ("notebooks",),
                              ("unit", "browser", "notebooks-8-cores-user", "notebooks-16-cores-no-ptrace"))
    assert sorted(p for stage in testrun.STAGES for p in stage) == sorted(testrun.PHASES)


def test_every_phase_starts_in_the_stage_order(fake_phases):
    started = fake_phases()
    testrun.run(list(testrun.PHASES), jobs=4, cell_timeout=600, extra=[])
    assert started == ["serial", "notebooks", "unit", "browser", "notebooks-8-cores-user", "notebooks-16-cores-no-ptrace"]


def test_every_chapter_and_solution_is_converted_for_nbval_with_its_cells(tmp_path):
    import nbformat

    for folder, name in (("chapters", "01_one"), ("solutions", "02_two"), ("chapters", "notes")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / f"{name}.md").write_text(
            "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
            "    format_version: 0.13\nkernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n"
            "---\n\n# Title\n\n```{code-cell} ipython3\nx = 1\n```\n")
    converted = testrun.convert_notebooks(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in converted] == [
        "_build/nbtest/chapters/01_one.ipynb", "_build/nbtest/solutions/02_two.ipynb"]
    cells = nbformat.read(converted[0], as_version=4).cells
    assert [(c.cell_type, c.source) for c in cells] == [("markdown", "# Title"), ("code", "x = 1")]


def test_the_many_core_phases_run_every_notebook_at_2000_images_in_a_data_folder_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKLAB_CORES", "2")  # a cap in the checkout's environment must not hide the emulated cores
    notebooks = [tmp_path / "_build" / "nbtest-small" / "chapters" / "06_x.ipynb"]
    commands = testrun.phase_commands(4, 600, [], notebooks)
    sixteen = commands["notebooks-16-cores-no-ptrace"]
    assert str(notebooks[0]) in sixteen and "packlab.course.pytest_book_cache" not in sixteen  # not the book's numbers
    env = testrun.PHASE_ENV["notebooks-16-cores-no-ptrace"](tmp_path)
    assert env["PACKLAB_COUNT"] == "2000" and env["PACKLAB_DATA"] == str(tmp_path / "_build" / "small-data")
    assert env["PACKLAB_VISIBLE_CORES"] == "16" and "PACKLAB_CORES" not in env
    assert env["PACKLAB_PYSPY"] == str(tmp_path / testrun.PTRACE_REFUSED_PYSPY)
    assert testrun.PHASE_ENV["notebooks-8-cores-user"](tmp_path)["PACKLAB_VISIBLE_CORES"] == "8"


def test_the_eight_core_phase_runs_as_a_normal_account_the_data_the_doctor_and_the_notebooks_that_read_the_cores(tmp_path):
    small = tmp_path / "_build" / "nbtest-small"
    needed, reader, other = (small / "solutions" / "03_per_worker_zip.ipynb", small / "chapters" / "02_zip.ipynb",
                             small / "chapters" / "06_scaling_out.ipynb")
    commands = testrun.phase_commands(4, 600, [], [needed, reader, other])
    command = commands["notebooks-8-cores-user"]
    assert "packlab.course.attendee_account" in command
    script = command[-1]
    assert script.index("packlab.data") < script.index("packlab.course.doctor") < script.index(str(needed))
    assert str(reader) in script and str(other) not in script
    sixteen = commands["notebooks-16-cores-no-ptrace"]
    assert all(str(n) in sixteen for n in (needed, reader, other)) and "packlab.course.pytest_core_reads" in sixteen


def test_the_normal_account_runs_what_the_issue_asks_of_it():
    assert set(testrun.NORMAL_ACCOUNT_NOTEBOOKS) >= {
        "chapters/00_setup", "chapters/01_jpeg_files", "chapters/04_per_worker_handles",
        "chapters/07_how_fast_is_enough", "chapters/08_process_boundary", "chapters/11_past_the_decode_ceiling"}
    assert len([n for n in testrun.NORMAL_ACCOUNT_NOTEBOOKS if n.startswith("solutions/")]) >= 2
    sources = {f"{p.parent.name}/{p.stem}" for p in testrun.notebook_sources(testrun.paths.repo_root())}
    assert set(testrun.NORMAL_ACCOUNT_NOTEBOOKS) | set(testrun.CORE_READERS) <= sources


@pytest.mark.parametrize("core_reads, expected", [("chapters/01_jpeg_files\nsolutions/01_jpeg_dataset\n", 0),
                                                  ("chapters/06_scaling_out\n", 1),  # read the count, not run at 8
                                                  (None, 1)])  # no log at all: the instrument broke
def test_a_notebook_that_reads_the_core_count_and_did_not_run_at_8_cores_fails_the_8_core_phase(
        fake_phases, core_reads, expected, capsys):
    fake_phases(core_reads=core_reads)
    assert testrun.run(list(testrun.PHASES), jobs=4, cell_timeout=600, extra=[]) == expected
    if core_reads == "chapters/06_scaling_out\n":
        assert "chapters/06_scaling_out" in capsys.readouterr().out


def test_the_log_names_each_notebook_that_reads_an_emulated_count(tmp_path, monkeypatch):
    from packlab import cpus
    from packlab.course.pytest_core_reads import notebooks_that_read

    log = tmp_path / "reads.log"
    monkeypatch.setattr(cpus, "_noted_reads", set())
    monkeypatch.setenv("PACKLAB_CORE_READS_LOG", str(log))
    monkeypatch.setenv("PACKLAB_NOTEBOOK", "chapters/02_zip")
    monkeypatch.delenv("PACKLAB_VISIBLE_CORES", raising=False)
    cpus.course_cores()
    assert notebooks_that_read(log) == set(), "only an emulated count is logged"
    monkeypatch.setenv("PACKLAB_VISIBLE_CORES", "16")
    assert cpus.course_cores() >= 1 and cpus.workers_for(4) >= 1
    monkeypatch.setenv("PACKLAB_NOTEBOOK", "solutions/07_parallel_map")
    cpus.course_cores()
    assert log.read_text().splitlines() == ["chapters/02_zip", "solutions/07_parallel_map"]


def test_the_ptrace_refusing_stand_in_exists_and_is_executable():
    import os

    standin = testrun.paths.repo_root() / testrun.PTRACE_REFUSED_PYSPY
    assert standin.is_file() and os.access(standin, os.X_OK)


def test_the_many_core_phases_cap_every_measurements_rounds_and_nothing_else_does(tmp_path, monkeypatch):
    from packlab import bench

    env = testrun.PHASE_ENV["notebooks-8-cores-user"](tmp_path)
    assert env[bench.CRASH_TEST_ROUNDS_VAR] == str(testrun.CRASH_TEST_ROUNDS)
    command = testrun.phase_commands(4, 600, [], [])["notebooks-8-cores-user"]
    assert bench.CRASH_TEST_ROUNDS_VAR in command[command.index("--keep-env") + 1]  # through to the normal account
    monkeypatch.delenv(bench.CRASH_TEST_ROUNDS_VAR, raising=False)
    assert len(bench.repeat(lambda: 1.0, rounds=5).values) == 5
    monkeypatch.setenv(bench.CRASH_TEST_ROUNDS_VAR, env[bench.CRASH_TEST_ROUNDS_VAR])
    runs = bench.interleaved({"a": lambda: 1.0, "b": lambda: 2.0, "c": lambda: 3.0})
    assert [len(s.values) for s in runs.values()] == [testrun.CRASH_TEST_ROUNDS] * 3


def test_the_many_core_phases_train_chapter_13s_instrument_on_a_few_seeds_only(monkeypatch):
    """Chapter 13 trains the same seeds at any core count: the full-data phase judges them, the crash tests run them."""
    import numpy as np

    from packlab import bench
    from packlab.accuracy import conditions

    trained = []

    def fake_map(function, jobs, processes, **shared):
        for name, group in jobs:
            trained.append((name, group))
            yield name, group, {name: np.full(len(group), 0.9)}

    monkeypatch.setattr(conditions, "forked_map", fake_map)
    planted = {"a": conditions.Condition(lambda seed: [])}
    monkeypatch.delenv(bench.CRASH_TEST_ROUNDS_VAR, raising=False)
    assert len(conditions.run_conditions(planted, None, None, range(12), progress=False)["a"]) == 12
    monkeypatch.setenv(bench.CRASH_TEST_ROUNDS_VAR, str(testrun.CRASH_TEST_ROUNDS))
    assert len(conditions.run_conditions(planted, None, None, range(12), progress=False)["a"]) == bench.CRASH_TEST_SEEDS
    trained.clear()
    effect = conditions.planted_effect_power(np.zeros((2000, 1)), None, 0.03, seeds=12, pool=36, draws=10)
    assert {len(group) for _, group in trained} == {bench.CRASH_TEST_SEEDS}
    assert effect.pool == bench.CRASH_TEST_SEEDS and effect.seeds == bench.CRASH_TEST_SEEDS // 2
    # The unpaired runs of training.accuracy_runs (exercise 12's smoke test): two seeds.
    from packlab.accuracy import training

    monkeypatch.setattr(training, "forked_map", lambda function, jobs, processes, **shared: (
        (name, seed, f"run {seed}") for name, seed in jobs))
    runs = training.accuracy_runs({"a": None}, [0] * 10, None, seeds=range(5), processes=1, progress=False)
    assert runs == {"a": ["run 0", "run 1"]}


def test_every_notebook_phase_ends_its_kernels_with_a_shutdown_request():
    commands = testrun.phase_commands(4, 600, [], [])
    for phase in ("notebooks", "notebooks-8-cores-user", "notebooks-16-cores-no-ptrace"):
        assert "packlab.course.pytest_kernel_exit" in " ".join(commands[phase]), phase


def test_a_kernel_ended_by_nbval_runs_its_exit_handlers(tmp_path):
    # MDS removes its /dev/shm names in an atexit handler; nbval's own kill skipped it and left them behind.
    import subprocess
    import sys
    import uuid

    import nbformat

    marker = tmp_path / f"exited-{uuid.uuid4().hex}"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"import atexit, pathlib\natexit.register(pathlib.Path({str(marker)!r}).touch)")])
    nbformat.write(notebook, tmp_path / "exits.ipynb")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path / "exits.ipynb"),
                          "--nbval-lax", "--nbval-current-env", "-p", "packlab.course.pytest_kernel_exit",
                          f"--rootdir={tmp_path}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert marker.exists(), "the kernel was killed before its atexit handlers ran"


def test_the_many_cores_passes_tune_one_rate_crop_one_range_and_run_one_loaders_ranks(monkeypatch):
    import numpy as np

    from packlab import bench
    from packlab.accuracy import conditions, stored_crops
    from packlab.stragglers import rank_loaders

    trained = []
    monkeypatch.setattr(conditions, "run_conditions", lambda named, *a, **k: (
        trained.extend(named) or {name: np.array([90.0]) for name in named}))
    monkeypatch.delenv(bench.CRASH_TEST_ROUNDS_VAR, raising=False)
    full = {"a": conditions.Condition(lambda seed: [])}
    conditions.tuned_rates(full, None, None, range(4))
    assert len(trained) == len(conditions.TUNING_RATES)
    assert len(stored_crops.crop_scales()) == 2 and len(rank_loaders(["a.tar", "b.tar"], 16, 0)) == 3
    monkeypatch.setenv(bench.CRASH_TEST_ROUNDS_VAR, str(testrun.CRASH_TEST_ROUNDS))
    trained.clear()
    best, table = conditions.tuned_rates(full, None, None, range(4))
    assert trained == [f"a @ {conditions.TUNING_RATES[0]:g}"] and best == {"a": conditions.TUNING_RATES[0]}
    assert list(stored_crops.crop_scales()) == ["8–100 %"]
    assert list(rank_loaders(["a.tar", "b.tar"], 16, 0)) == ["tar shards, decode"]
