"""``make lab`` without a browser: its command line, its settings, and what saving writes.

The browser test (``test_lab_browser.py``) walks the attendee's path; these quick checks
pin down each piece it relies on against the installed JupyterLab and jupytext, so that
an upgrade that renames a setting or a viewer fails here, with a message that says which.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from pathlib import Path

import json5
import jsonschema
import pytest

from packlab import paths
from packlab.course import lab

ROOT = paths.repo_root()


def test_the_command_serves_the_repository_on_localhost_with_state_of_its_own(tmp_path):
    cmd = lab.command(port=8123, state_dir=tmp_path, token="abc", open_browser=False, port_retries=0)
    assert cmd[1:3] == ["-m", "jupyterlab"]
    assert "--ServerApp.ip=127.0.0.1" in cmd
    assert "--ServerApp.port=8123" in cmd and "--ServerApp.port_retries=0" in cmd
    assert f"--ServerApp.root_dir={ROOT}" in cmd
    assert f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}" in cmd
    assert f"--LabApp.user_settings_dir={tmp_path / 'user-settings'}" in cmd
    assert "--IdentityProvider.token=abc" in cmd and "--ServerApp.open_browser=False" in cmd
    assert ("--allow-root" in cmd) == (os.geteuid() == 0)
    default = lab.command()
    assert not any(arg.startswith("--IdentityProvider.token") for arg in default), "Jupyter makes up make lab's token"
    assert f"--LabApp.workspaces_dir={lab.STATE_DIR / 'workspaces'}" in default, "never the home folder's workspaces"


def _installed_schema(plugin_id: str) -> dict:
    from jupyterlab.commands import get_app_dir

    package, plugin = plugin_id.split(":")
    return json.loads((Path(get_app_dir()) / "schemas" / package / f"{plugin}.json").read_text())


def test_the_shipped_settings_are_valid_for_the_installed_jupyterlab():
    settings = json5.loads(lab.SETTINGS_SOURCE.read_text())
    for plugin_id, values in settings.items():
        schema = _installed_schema(plugin_id)
        unknown = set(values) - set(schema["properties"])
        assert not unknown, f"{plugin_id} has no settings {sorted(unknown)} in this JupyterLab"
        jsonschema.validate(values, schema)
    assert settings["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"] == {"markdown": "Jupytext Notebook"}
    # "contentVisibility" (the default) leaves cells below the window unrendered, and
    # jupyterlab-myst then evaluates no {eval} role in them on "Run All".
    assert settings["@jupyterlab/notebook-extension:tracker"]["windowingMode"] == "none"


def test_the_viewer_the_settings_name_is_the_one_jupytext_registers():
    static = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyterlab-jupytext" / "static"
    bundle = "".join(p.read_text(errors="replace") for p in static.glob("*.js"))
    assert re.search(r'FACTORY="Jupytext Notebook"', bundle), "jupytext's lab extension renamed its notebook viewer"
    assert '"markdown"' in bundle, "jupytext's notebook viewer no longer lists the markdown file type"


def test_install_settings_puts_them_where_jupyterlab_reads_its_defaults():
    target = lab.install_settings()
    assert target.read_bytes() == lab.SETTINGS_SOURCE.read_bytes()
    assert target.parent.name == "overrides.d" and target.parent.parent.name == "settings"
    assert target.is_relative_to(Path(sys.prefix)), "the settings belong to the environment, not the home folder"
    from jupyterlab_server.settings_utils import _get_overrides

    overrides, error = _get_overrides(str(target.parent.parent))
    assert not error, error
    assert overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]["markdown"] == "Jupytext Notebook"


def _save_as_jupyterlab_does(root: Path, name: str, change) -> None:
    """Open ``name`` through jupytext's contents manager (as JupyterLab does), apply ``change``, save."""
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
    from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

    manager = build_async_jupytext_contents_manager_class(AsyncLargeFileManager)(root_dir=str(root))

    async def open_change_save():
        model = await manager.get(name, content=True, type="notebook")
        change(model["content"])
        await manager.save({"type": "notebook", "format": "json", "content": model["content"]}, name)

    asyncio.run(open_change_save())


@pytest.fixture
def repository_copy(tmp_path):
    for name in ("jupytext.toml", "README.md", "intro.md", "chapters/03_zip_pitfall.md", "exercises/index.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, tmp_path / name)
    return tmp_path


def test_saving_a_run_chapter_keeps_cell_options_and_drops_evaluated_expressions(repository_copy):
    chapter = "chapters/03_zip_pitfall.md"
    original = (repository_copy / chapter).read_text()

    def run_in_jupyterlab(notebook):
        notebook["metadata"]["language_info"] = {"name": "python", "version": "3"}
        cited = next(c for c in notebook["cells"] if c["cell_type"] == "markdown" and "{eval}" in c["source"])
        cited["metadata"]["user_expressions"] = [
            {"expression": "runs_failed", "result": {"status": "ok", "data": {"text/plain": "5"}, "metadata": {}}}
        ]
        cited["metadata"]["jp-MarkdownHeadingCollapsed"] = True
        first_code = next(c for c in notebook["cells"] if c["cell_type"] == "code")
        first_code["metadata"]["tags"] = ["hide-input"]
        first_code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran"}]
        first_code["execution_count"] = 1

    _save_as_jupyterlab_does(repository_copy, chapter, run_in_jupyterlab)
    saved = (repository_copy / chapter).read_text()
    for session_only in ("user_expressions", "jp-MarkdownHeadingCollapsed", "language_info"):
        assert session_only not in saved
    first_cell = "```{code-cell} ipython3\n"
    assert saved.count(first_cell + ":tags: [hide-input]\n") == 1, "the MyST cell option was not written"
    # Nothing else changed: the header already records the pinned jupytext's version (make headers).
    restored = saved.replace(":tags: [hide-input]\n\n", "", 1)
    assert restored == original
    paired = json.loads((repository_copy / chapter).with_suffix(".ipynb").read_text())
    assert any("user_expressions" in c["metadata"] for c in paired["cells"]), "the paired notebook keeps the values"


@pytest.mark.parametrize("page", ["README.md", "intro.md", "exercises/index.md"])
def test_saving_a_page_that_is_no_notebook_leaves_it_as_it_was(repository_copy, page):
    """Every .md opens as a notebook, these plain pages too; saving one must not add a notebook header."""
    original = (repository_copy / page).read_text()
    _save_as_jupyterlab_does(repository_copy, page, lambda nb: nb["metadata"].update(language_info={"name": "python"}))
    assert (repository_copy / page).read_text() == original


def test_setup_only_prepares_without_starting_jupyterlab(monkeypatch, tmp_path, capsys):
    """For a JupyterLab started by someone else (Open OnDemand, a hub): settings and copies, no server."""
    made = []
    monkeypatch.setattr(lab, "prepare", lambda *args, **kwargs: made.append(1) or [tmp_path / "01_a.md"])
    monkeypatch.setattr(lab.os, "execv", lambda *args: pytest.fail("--setup-only must not start JupyterLab"))
    lab.main(["--setup-only"])
    assert made and "1 exercises copied into mywork/exercises/" in capsys.readouterr().out


def test_the_command_can_serve_another_folder(tmp_path):
    assert f"--ServerApp.root_dir={tmp_path.resolve()}" in lab.command(root=tmp_path)
