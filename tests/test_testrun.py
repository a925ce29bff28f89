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
    monkeypatch.setattr(testrun, "convert_notebooks", lambda root, out_dir=None: [])
    started = []

    def use(empty=None):
        commands = testrun.phase_commands(4, 600, [])

        def fake_popen(command, cwd, stdout=None, stderr=None, env=None):
            phase = next(p for p, c in commands.items() if c == command)
            started.append(phase)
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


def test_the_eight_core_phase_runs_as_a_normal_account_the_data_the_doctor_and_every_notebook(tmp_path):
    notebooks = [tmp_path / "_build" / "nbtest-small" / "solutions" / "03_x.ipynb"]
    command = testrun.phase_commands(4, 600, [], notebooks)["notebooks-8-cores-user"]
    assert "packlab.course.attendee_account" in command
    script = command[-1]
    assert script.index("packlab.data") < script.index("packlab.course.doctor") < script.index(str(notebooks[0]))


def test_the_ptrace_refusing_stand_in_exists_and_is_executable():
    import os

    standin = testrun.paths.repo_root() / testrun.PTRACE_REFUSED_PYSPY
    assert standin.is_file() and os.access(standin, os.X_OK)
