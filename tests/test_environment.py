"""The environment the course runs in: pins agree everywhere, and torch/torchvision really work."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version

import yaml

from packlab import paths

# conda-forge names that differ from the PyPI names
CONDA_TO_PYPI = {"pytorch": "torch", "python-lmdb": "lmdb"}


def _pins(requirements: list[str], where: str) -> dict[str, str]:
    pins = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", requirement)
        assert match, f"pyproject.toml {where}: {requirement!r} is not pinned exactly (name==version)"
        pins[match.group(1).lower()] = match.group(2)
    return pins


def _project() -> dict:
    return tomllib.loads((paths.repo_root() / "pyproject.toml").read_text())["project"]


def _extras_pins() -> dict[str, dict[str, str]]:
    """``{extra: {name: version}}`` of pyproject.toml's optional dependencies."""
    return {extra: _pins(requirements, f"extra {extra!r}") for extra, requirements in _project().get("optional-dependencies", {}).items()}


def _pyproject_pins() -> dict[str, str]:
    """Every pin of pyproject.toml: the dependencies and every extra's."""
    pins = _pins(_project()["dependencies"], "dependencies")
    for extra in _extras_pins().values():
        pins.update(extra)
    return pins


def _environment(name: str = "environment.yml") -> dict:
    return yaml.safe_load((paths.repo_root() / name).read_text())


def _environment_pins(name: str = "environment.yml") -> dict[str, str]:
    """``{PyPI name: version}`` of a conda environment file (a conda build string after the version is dropped)."""
    env = _environment(name)
    assert env["channels"] == ["conda-forge"]
    pins = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):  # the pip section: packages conda-forge does not carry at our pins
            for requirement in dep.get("pip", []):
                if requirement.startswith("-e"):
                    continue
                name, sep, pinned = requirement.partition("==")
                assert sep and pinned, f"environment.yml pip section: {requirement!r} is not pinned as name==version"
                pins[name.lower()] = pinned
            continue
        if dep in ("pip",) or dep.startswith("python="):
            continue
        name, _, pinned = dep.partition("=")
        assert pinned and not pinned.startswith("="), f"{name}: {dep!r} is not pinned as name=version"
        pins[CONDA_TO_PYPI.get(name.lower(), name.lower())] = pinned.split("=", 1)[0]
    return pins


def _agree(pyproject: dict[str, str], environment: dict[str, str], name: str) -> None:
    assert set(pyproject) == set(environment), (
        f"only in pyproject.toml: {sorted(set(pyproject) - set(environment))}; "
        f"only in {name}: {sorted(set(environment) - set(pyproject))}"
    )
    differing = {n: (pyproject[n], environment[n]) for n in pyproject if pyproject[n] != environment[n]}
    assert not differing, f"versions differ (pyproject, {name}): {differing}"


def test_the_attendees_environment_is_pyprojects_dependencies_with_cpu_pytorch():
    _agree(_pins(_project()["dependencies"], "dependencies"), _environment_pins(), "environment.yml")
    assert "pytorch=2.13.0=cpu*" in _environment()["dependencies"], "environment.yml: PyTorch's CPU build"


def test_the_developers_environment_is_every_pin_of_pyproject():
    _agree(_pyproject_pins(), _environment_pins("environment-dev.yml"), "environment-dev.yml")
    assert _environment("environment-dev.yml")["name"] != _environment()["name"], "two environments, two names"


def test_a_pin_missing_from_an_environment_is_named():
    import pytest

    with pytest.raises(AssertionError, match="only in pyproject.toml: \\['nbval'\\]"):
        _agree({"nbval": "0.11.0", "torch": "2.13.0"}, {"torch": "2.13.0"}, "environment.yml")


def test_the_dev_extra_holds_the_book_and_test_tools_and_nothing_twice():
    """`make lab` installs the dependencies; `make book` and `make test` add the dev extra."""
    base = _pins(_project()["dependencies"], "dependencies")
    extras = _extras_pins()
    assert {"jupyter-book", "nbval", "pytest", "pytest-xdist", "playwright"} <= set(extras["dev"])
    for extra, pins in extras.items():
        assert not set(pins) & set(base), f"extra {extra!r} repeats dependencies: {sorted(set(pins) & set(base))}"
    assert {"torch", "torchvision", "jupyterlab", "jupytext", "jupyterlab-myst", "ipykernel"} <= set(base)
    makefile = (paths.repo_root() / "Makefile").read_text()
    assert "-e '.[dev,dali]'" in makefile and re.search(r"(?m)^book: .*setup-dev", makefile) and re.search(r"(?m)^lab: data$", makefile)
    # DALI, chapter 11's peer, is for the book, the tests and the benchmark, not in the attendees' install
    assert "nvidia-dali-cuda130" in extras["dali"] and not any(name.startswith("nvidia-dali") for name in base)
    assert re.search(r"(?m)^bench: .*setup-dev", makefile)


def test_installed_versions_are_the_pinned_ones():
    wrong = {}
    for name, pinned in _pyproject_pins().items():
        installed = version(name).split("+")[0]  # torch reports e.g. 2.13.0+cu130
        if installed != pinned:
            wrong[name] = (pinned, installed)
    assert not wrong, f"installed versions differ from the pins (pinned, installed): {wrong}"


def test_python_requirement():
    project = tomllib.loads((paths.repo_root() / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"


def test_torchvision_imports_and_its_operators_are_registered():
    # A torchvision built for another torch imports but fails here with
    # "operator torchvision::nms does not exist".
    import torch
    import torchvision

    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [50.0, 50.0, 60.0, 60.0]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    keep = torchvision.ops.nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2]
    from torchvision.io import decode_jpeg  # noqa: F401  (the image extension loads)


def test_packages_installed_without_dependencies_are_pinned_everywhere_and_installed():
    """pyproject's [tool.packlab] no-deps: exact pins, named in environment.yml's instructions, installed at that version."""
    from packlab.course.nodeps import no_deps_pins

    pins = no_deps_pins()
    assert pins, "no [tool.packlab] no-deps list in pyproject.toml"
    text = (paths.repo_root() / "environment.yml").read_text()
    listed = re.findall(r"^#\s+pip install --no-deps (.+)$", text, flags=re.M)
    assert listed and sorted(listed[0].split()) == sorted(pins), (
        f"environment.yml must say `pip install --no-deps {' '.join(pins)}`; it says {listed}")
    for pin in pins:
        name, _, pinned = pin.partition("==")
        assert pinned, f"{pin!r} is not pinned as name==version"
        assert name.lower() not in _pyproject_pins(), f"{name} is both a dependency and a no-deps package"
        assert version(name) == pinned, f"{name}: installed {version(name)}, pinned {pinned} (run make setup)"
