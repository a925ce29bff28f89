# Packed Data Formats for Deep Learning: build, data and test targets.
# Every target sets up what it needs, so each works on a fresh clone.

SHELL := /bin/bash
# The Python the environment is built with (3.10 or newer), by name or version:
# `make setup PYTHON=python3.12`. See setup.md for macOS, whose own python3 is 3.9.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# uv is bootstrapped here from PyPI when it is not on PATH, with this Python (any 3.8+).
TOOLS := .tools
BOOTSTRAP_PYTHON ?= python3
# uv does not download a Python of its own unless asked: the course uses the machine's.
# Where the machine's Python is too old, `make setup UV_PYTHON_DOWNLOADS=automatic PYTHON=3.12`
# lets uv fetch one (from GitHub, not PyPI).
UV_PYTHON_DOWNLOADS ?= never
export UV_PYTHON_DOWNLOADS
# CPU-only PyTorch: `make setup TORCH_BACKEND=cpu` (on a fresh clone, or after
# `make distclean`) installs torch and torchvision from PyTorch's own CPU wheel index
# instead of PyPI's Linux build with its CUDA libraries (3.6 GB the course never uses).
# Needs PyTorch's index to be reachable (see setup.md); everything else still comes from
# PyPI. It is uv's --torch-backend, so any value uv knows works (cpu, cu126, ..., auto).
TORCH_BACKEND ?=
UV_INSTALL := $(if $(TORCH_BACKEND),UV_TORCH_BACKEND=$(TORCH_BACKEND) )"$$uv" pip install --python $(PY)
# Notebooks converted from MyST markdown for nbval.
CELL_TIMEOUT ?= 600

.PHONY: help setup setup-dev system-deps data doctor lab book test bench clean clean-packed distclean exercises grade gradebook grade-repeat book-instructor release submit headers

help:
	@echo "make doctor     is this machine ready? one line per need (Python, cores, memory, disk, /dev/shm, JupyterLab, data)"
	@echo "make lab        set up, generate data, start JupyterLab: chapters and exercises open as notebooks (your copies in mywork/)"
	@echo "make book       set up (with the book and test tools), generate data, execute every chapter, build _build/html"
	@echo "make test       unit tests (in parallel), every chapter and solution notebook under nbval, browser tests"
	@echo "make bench      time every loader on the full dataset; writes _build/bench/bench.json and bench.png"
	@echo "make setup      create .venv with uv and install the course package (editable): what an attendee needs"
	@echo "make setup-dev  the same, plus the book and test tools and DALI (the dev and dali extras)"
	@echo "make system-deps  the Debian packages the tests need (Chromium, Slurm, munge), installed once as root"
	@echo "make data       generate the 10k-image dataset (PACKLAB_COUNT=2000: a smaller one; no-op if a verified one exists)"
	@echo "make exercises  write exercises/NN_*.md from solutions/NN_*.md (solutions become stubs)"
	@echo "make grade NB=exercises/01_jpeg_dataset.md   run notebooks in a fresh kernel and score their checks"
	@echo "make submit NAME=yourname   pack your exercises (mywork/) as submissions/NAME/exercises/ and NAME.zip"
	@echo "make gradebook CLASS=folder  every attendee's notebooks (folder/<attendee>/exercises/) into folder/gradebook.csv"
	@echo "make grade-repeat CHECK=per_worker_zip N=20   one solution's check N times in one process, timed"
	@echo "make release DEST=folder  the attendees' copy, without solutions/, as a new commit of the git repository DEST"
	@echo "make headers    rewrite the notebooks' headers as the pinned jupytext writes them on saving"
	@echo "make book-instructor  the same book plus the solutions, executed, in _build/instructor"
	@echo "make clean      remove _build/ and paired .ipynb files"
	@echo "make clean-packed  remove the zips and tar shards the chapters wrote (data/packed/); keeps the dataset"
	@echo "make distclean  also remove .venv/, $(TOOLS)/ and the generated data"

# uv: from PATH, or installed from PyPI into $(TOOLS)/ (sets the shell variable uv).
define find_uv
uv=$$(command -v uv || true); \
if [ -z "$$uv" ]; then \
  uv=$(TOOLS)/bin/uv; \
  if [ ! -x "$$uv" ]; then \
    echo "uv not found on PATH: installing it from PyPI into $(TOOLS)/"; \
    $(BOOTSTRAP_PYTHON) -m venv $(TOOLS); \
    $(TOOLS)/bin/pip install --quiet uv; \
  fi; \
fi
endef

# The attendee's environment: the course package and what the chapters and exercises need.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@set -e; $(find_uv); \
	"$$uv" venv --allow-existing --python $(PYTHON) $(VENV); \
	$(UV_INSTALL) -e .; \
	$(UV_INSTALL) --no-deps $$($(PY) -m packlab.course.nodeps)
	@touch $@

# The same plus the book and test tools (pyproject.toml's dev extra) and DALI, chapter 11's peer (the dali extra).
setup-dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: $(VENV)/.installed
	@set -e; $(find_uv); \
	$(UV_INSTALL) -e '.[dev,dali]'
	@touch $@

data: setup
	$(PY) -m packlab.data

# The Debian packages the tests need (packlab/course/system_deps.py: Chromium for the browser
# tests, slurm-wlm and munge for the Slurm job), installed with one apt-get, before any test
# runs: tests run side by side and two apt-gets at once fail on dpkg's lock. Does nothing when
# they are there; says which tests will skip when it cannot install (fails under CI=true).
system-deps: setup
	$(PY) -m packlab.course.system_deps

# A go/no-go check of this machine (packlab/course/doctor.py); without make, from the
# repository: python3 -m packlab.course.doctor (any Python 3; it says what is missing).
doctor: setup
	$(PY) -m packlab.course.doctor

# JupyterLab on the repository, on 127.0.0.1: a double-click opens a chapter or an exercise
# (.md) as a notebook. Settings come from jupyterlab-settings/, installed into the
# environment; workspaces and user settings live in _build/lab/ (packlab/course/lab.py).
# The exercises are copied into mywork/ (git-ignored) the first time, so `git pull` never
# meets an attendee's work. LAB_ARGS=--no-browser on a remote machine (see setup.md).
LAB_ARGS ?=
lab: data
	$(PY) -m packlab.course.lab $(LAB_ARGS)

# -W -n: warnings and broken references fail the build; --keep-going reports all of them first.
book: setup-dev data
	$(VENV)/bin/jupyter-book build . -W -n --keep-going
	@echo "open _build/html/index.html"

exercises: setup
	$(PY) -m packlab.course.exercises

grade: data
	@test -n "$(NB)" || { echo "usage: make grade NB='exercises/01_jpeg_dataset.md [more notebooks]'"; exit 2; }
	$(PY) -m packlab.course.grade $(NB)

# Every attendee's exercise notebooks under CLASS/<attendee>/exercises/, each in a fresh
# kernel, into CLASS/gradebook.csv and a table (see instructor.md, "Grading the whole class").
gradebook: data
	@test -n "$(CLASS)" || { echo "usage: make gradebook CLASS=folder-with-one-folder-per-attendee"; exit 2; }
	$(PY) -m packlab.course.grade --class $(CLASS)

# One check N times in a row in one process (of NB, by default the solution notebook), with
# min/median/max wall time: looks for failures that show only now and then. Run it on an
# otherwise idle machine.
CHECK ?= per_worker_zip
N ?= 20
grade-repeat: data
	$(PY) -m packlab.course.grade --repeat $(N) --check $(CHECK) $(NB)

# The instructors' book: the same book plus a part with the solution notebooks, executed.
# It shares the attendees' book's execution cache, so after `make test` or `make book` it
# executes only what neither has run (packlab/course/exercises.py, instructor_config).
INSTRUCTOR := _build/instructor
book-instructor: setup-dev data
	$(PY) -m packlab.course.exercises --instructor $(INSTRUCTOR)
	$(VENV)/bin/jupyter-book build . -W -n --keep-going --toc $(INSTRUCTOR)/_toc.yml --config $(INSTRUCTOR)/_config.yml \
	  --path-output $(INSTRUCTOR)
	@echo "open $(INSTRUCTOR)/_build/html/index.html"

# Four phases (packlab/course/testrun.py): the tests marked `serial` (they time something),
# with nothing else running; every chapter and solution notebook under nbval, one at a time
# and alone, each stored in the book's execution cache (packlab/course/pytest_book_cache.py)
# so the book never executes it again; then the other unit tests, several at a time, with
# the browser tests (which build the book from that cache) beside them. Prints the wall
# time of each phase.
# TEST_JOBS=N: parallel unit-test processes (default: two per core).
TEST_JOBS ?=
test: setup-dev data system-deps
	$(PY) -m packlab.course.testrun --cell-timeout=$(CELL_TIMEOUT) $(if $(TEST_JOBS),--jobs $(TEST_JOBS),)

# Loader speed against the decode ceiling and the peers, the small-file penalty and the
# packed formats (about 30 minutes on two cores).
# Speed targets live here, never in the tests. Run it on an otherwise idle machine.
# BENCH_ARGS=--quick: the same on 600 images, to check that everything runs.
BENCH_ARGS ?=
bench: setup-dev data
	$(PY) -m packlab.course.benchmark $(BENCH_ARGS)

# The attendees' copy of the course: every tracked file but solutions/ and the tests, the
# notebooks' headers as the pinned jupytext saves them, committed into the git repository
# DEST (created if needed; a release into an existing one is a new commit attendees pull).
release: setup
	@test -n "$(DEST)" || { echo "usage: make release DEST=path/to/attendee-repository"; exit 2; }
	$(PY) -m packlab.course.release release $(DEST)

# An attendee's exercises (mywork/, else exercises/), packed the way `make gradebook` reads
# them: submissions/NAME/exercises/*.md and submissions/NAME.zip holding NAME/exercises/.
# SUBMIT_FROM=folder and SUBMIT_TO=folder change where the notebooks come from and go.
NAME ?= $(USER)
SUBMIT_FROM ?=
SUBMIT_TO ?=
submit: setup
	$(PY) -m packlab.course.release submit --name "$(NAME)" $(if $(SUBMIT_FROM),--from "$(SUBMIT_FROM)") $(if $(SUBMIT_TO),--out "$(SUBMIT_TO)")

# The notebooks' headers as the pinned jupytext writes them when JupyterLab saves one, so
# that saving an unchanged chapter leaves it byte-identical (and `git pull` unblocked).
headers: setup
	$(PY) -m packlab.course.release headers

clean:
	rm -rf _build
	find chapters solutions exercises -name '*.ipynb' -delete 2>/dev/null || true

# The packed copies (zips, tar shards, raw-pixel folder) are derived from the dataset and
# rewritten when a chapter needs them again; the dataset itself stays.
clean-packed:
	@packed="$${PACKLAB_DATA:-data}/packed"; \
	if [ -d "$$packed" ]; then du -sh "$$packed"; rm -rf "$$packed"; echo "removed $$packed"; \
	else echo "nothing to remove: $$packed does not exist"; fi

distclean: clean
	rm -rf $(VENV) $(TOOLS) data
