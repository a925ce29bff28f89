# Packed Data Formats for Deep Learning: build, data and test targets.
# Every target sets up what it needs, so each works on a fresh clone.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# uv is bootstrapped here from PyPI when it is not on PATH.
TOOLS := .tools
# Never let uv download its own Python: the course uses the machine's python3.
export UV_PYTHON_DOWNLOADS := never
# Notebooks converted from MyST markdown for nbval.
CELL_TIMEOUT ?= 600

.PHONY: help setup data lab book test bench clean clean-packed distclean exercises grade gradebook grade-repeat book-instructor

help:
	@echo "make lab        set up, generate data, start JupyterLab: chapters and exercises open as notebooks"
	@echo "make book       set up, generate data, execute every chapter, build _build/html"
	@echo "make test       unit tests (in parallel), every chapter and solution notebook under nbval, browser tests"
	@echo "make bench      time every loader on the full dataset; writes _build/bench/bench.json and bench.png"
	@echo "make setup      create .venv with uv and install the course package (editable)"
	@echo "make data       generate the 10k-image dataset (no-op if a verified one exists)"
	@echo "make exercises  write exercises/NN_*.md from solutions/NN_*.md (solutions become stubs)"
	@echo "make grade NB=exercises/01_jpeg_dataset.md   run notebooks in a fresh kernel and score their checks"
	@echo "make gradebook CLASS=folder  every attendee's notebooks (folder/<attendee>/exercises/) into folder/gradebook.csv"
	@echo "make grade-repeat CHECK=per_worker_zip N=20   one solution's check N times in one process, timed"
	@echo "make book-instructor  the same book plus the solutions, executed, in _build/instructor"
	@echo "make clean      remove _build/ and paired .ipynb files"
	@echo "make clean-packed  remove the zips and tar shards the chapters wrote (data/packed/); keeps the dataset"
	@echo "make distclean  also remove .venv/, $(TOOLS)/ and the generated data"

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@set -e; \
	uv=$$(command -v uv || true); \
	if [ -z "$$uv" ]; then \
	  uv=$(TOOLS)/bin/uv; \
	  if [ ! -x "$$uv" ]; then \
	    echo "uv not found on PATH: installing it from PyPI into $(TOOLS)/"; \
	    $(PYTHON) -m venv $(TOOLS); \
	    $(TOOLS)/bin/pip install --quiet uv; \
	  fi; \
	fi; \
	"$$uv" venv --allow-existing --python $(PYTHON) $(VENV); \
	"$$uv" pip install --python $(PY) -e .
	@touch $@

data: setup
	$(PY) -m packlab.data

# JupyterLab on the repository, on 127.0.0.1: a double-click opens a chapter or an exercise
# (.md) as a notebook. Settings come from jupyterlab-settings/, installed into the
# environment; workspaces and user settings live in _build/lab/ (packlab/course/lab.py).
lab: data
	$(PY) -m packlab.course.lab

# -W -n: warnings and broken references fail the build; --keep-going reports all of them first.
book: data
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
book-instructor: data
	$(PY) -m packlab.course.exercises --instructor $(INSTRUCTOR)
	$(VENV)/bin/jupyter-book build . -W -n --keep-going --toc $(INSTRUCTOR)/_toc.yml --config $(INSTRUCTOR)/_config.yml \
	  --path-output $(INSTRUCTOR)
	@echo "open $(INSTRUCTOR)/_build/html/index.html"

# Four phases (packlab/course/testrun.py): the unit tests that only wait, several at a time;
# those marked `serial` (they time something), alone; every chapter and solution notebook
# under nbval, one at a time and alone, each stored in the book's execution cache
# (packlab/course/pytest_book_cache.py) so the book never executes it again; then the
# browser tests, which build the book from that cache. Prints the wall time of each phase.
# TEST_JOBS=N: parallel unit-test processes (default: two per core).
TEST_JOBS ?=
test: data
	$(PY) -m packlab.course.testrun --cell-timeout=$(CELL_TIMEOUT) $(if $(TEST_JOBS),--jobs $(TEST_JOBS),)

# Loader speed against the decode ceiling and the peers, the small-file penalty and the
# packed formats (about 30 minutes on two cores).
# Speed targets live here, never in the tests. Run it on an otherwise idle machine.
# BENCH_ARGS=--quick: the same on 600 images, to check that everything runs.
BENCH_ARGS ?=
bench: data
	$(PY) -m packlab.course.benchmark $(BENCH_ARGS)

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
