# Packed Data Formats for Deep Learning: build, data and test targets.
# Every target sets up what it needs, so each works on a fresh clone.

SHELL := /bin/bash
# This checkout's settings: `make configure NAME=value ...` writes them into settings.mk
# (git-ignored), which this Makefile includes and packlab reads too (packlab/settings.py),
# so a new terminal needs no export. A value on the command line or in the environment
# wins over the file's (the file uses ?=). PACKLAB_SETTINGS names another file.
SETTINGS_FILE := $(or $(PACKLAB_SETTINGS),settings.mk)
-include $(SETTINGS_FILE)
# The Python the environment is built with (3.10 or newer), by name or version:
# `make setup PYTHON=python3.12`. See setup.md for macOS, whose own python3 is 3.9.
PYTHON ?= python3
# The environment: VENV=/scratch/$USER/packed-venv (on a cluster with a file quota), or an
# active conda environment's $CONDA_PREFIX, which the Makefile then uses and never installs into.
VENV ?= .venv
PY := $(VENV)/bin/python
# uv is bootstrapped here from PyPI when it is not on PATH, with this Python (any 3.8+).
TOOLS := .tools
BOOTSTRAP_PYTHON ?= python3
# The oldest uv whose --torch-backend is more than a preview (0.7.14); a uv without it ignores
# UV_TORCH_BACKEND without a word and installs PyPI's CUDA build.
MIN_UV := 0.7.14
# uv does not download a Python of its own unless asked: the course uses the machine's.
# Where the machine's Python is too old, `make setup UV_PYTHON_DOWNLOADS=automatic PYTHON=3.12`
# lets uv fetch one (from GitHub, not PyPI).
UV_PYTHON_DOWNLOADS ?= never
export UV_PYTHON_DOWNLOADS
# Where torch comes from when the environment is created. On Linux the default is PyTorch's
# CPU wheel index: PyPI's Linux build brings 3.6 GB of CUDA libraries the course never uses.
# Where that index cannot be reached, make setup says so and takes PyPI's build (recorded in
# $(VENV)/.torch-backend for make doctor). TORCH_BACKEND=pypi: PyPI's build on purpose; any
# other value is uv's --torch-backend (cu130, auto, ...). Applies to a new environment only.
TORCH_BACKEND ?= $(if $(filter Linux,$(shell uname -s)),cpu,pypi)
# A folder of wheels (`make wheelhouse`): install from it alone, without any network.
WHEELHOUSE ?=
# --compile-bytecode: every module is compiled once, here. Where the bytecode cache cannot be written
# (PYTHONDONTWRITEBYTECODE set, as on some images and CI machines, or a hub's read-only environment)
# Python would otherwise compile torch and torchvision from source in every process it starts:
# each notebook kernel and each spawned DataLoader worker (7 s of CPU instead of 3 here, per process).
UV_INSTALL = "$$uv" pip install --compile-bytecode --python $(PY) $(if $(WHEELHOUSE),--offline --no-index --find-links $(WHEELHOUSE))
# Notebooks converted from MyST markdown for nbval.
CELL_TIMEOUT ?= 600

.PHONY: help configure setup setup-dev system-deps data doctor wheelhouse lab book test bench clean clean-packed distclean exercises grade gradebook grade-repeat book-instructor release submit headers update hub hub-proxy board handback feedback loadtest container container-check

help:
	@echo "make configure  this checkout's settings (PACKLAB_COUNT, PACKLAB_DATA, VENV, TORCH_BACKEND, PACKLAB_CORES) into $(SETTINGS_FILE); shows them"
	@echo "make doctor     set up, generate the data, and check this machine: one line per need, READY when all pass"
	@echo "make lab        set up, generate data, start JupyterLab: chapters and exercises open as notebooks (your copies in mywork/)"
	@echo "make book       set up (with the book and test tools), generate data, execute every chapter, build _build/html"
	@echo "make test       unit tests (in parallel), every chapter and solution notebook under nbval, browser tests"
	@echo "make bench      time every loader on the full dataset; writes _build/bench/bench.json and bench.png"
	@echo "make setup      create .venv with uv and install the course package (editable): what an attendee needs"
	@echo "make setup-dev  the same, plus the book and test tools and DALI (the dev and dali extras)"
	@echo "make system-deps  the Debian packages the tests need (Chromium, Slurm, munge), installed once as root"
	@echo "make system-deps HUB=1  only what the class hub needs (bubblewrap; prints the dnf line for RHEL/Rocky)"
	@echo "make data       generate the 10k-image dataset (PACKLAB_COUNT=2000: a smaller one; no-op if a verified one exists)"
	@echo "make wheelhouse every wheel make setup installs, into wheelhouse/; at the venue: make setup WHEELHOUSE=folder (offline)"
	@echo "make exercises  write exercises/NN_*.md from solutions/NN_*.md (solutions become stubs)"
	@echo "make grade NB=exercises/01_jpeg_dataset.md   run notebooks in a fresh kernel and score their checks"
	@echo "make submit NAME=yourname   pack your exercises (mywork/) as submissions/NAME/exercises/ and NAME.zip"
	@echo "make update     close your chapters first; brings in the instructor's latest release (your work kept) and names the chapters it changed"
	@echo "make container  the course as an OCI image (podman; Debian base from mmdebstrap, then PyPI); make container-check runs the doctor and chapter 1 in it"
	@echo "make gradebook CLASS=folder  every attendee's notebooks (folder/<attendee>/exercises/) into folder/gradebook.csv, each in a sandbox"
	@echo "make handback CLASS=folder   a zip per attendee of their feedback (folder/handback/NAME.zip), for a laptop room"
	@echo "make feedback ZIP=NAME.zip   unpack the zip your instructor handed back into mywork/feedback/"
	@echo "make hub CLASS_LIST=class.txt  a JupyterHub for the class on this machine (hub/), with the live board at /services/board/"
	@echo "make loadtest   simulated attendees on a class hub (ATTENDEES=2 CORES_PER_ATTENDEE=1 LOADTEST_ARGS=--oversubscribe|--noisy): _build/loadtest/report.md"
	@echo "make board RECORDS=folder   the live board of a class folder of check runs, on 127.0.0.1 (no hub); BOARD_HOST=0.0.0.0: a laptop room's checks post to it"
	@echo "make grade-repeat CHECK=per_worker_zip N=20   one solution's check N times in one process, timed"
	@echo "make release DEST=folder  the attendees' copy, without solutions/, as a new commit of the git repository DEST (SOLUTIONS=01,03: hand those out)"
	@echo "make headers    rewrite the notebooks' headers as the pinned jupytext writes them on saving"
	@echo "make book-instructor  the same book plus the solutions, executed, in _build/instructor"
	@echo "make clean      remove _build/ and paired .ipynb files"
	@echo "make clean-packed  remove the zips and tar shards the chapters wrote (data/packed/); keeps the dataset"
	@echo "make distclean  also remove $(VENV)/ (not a conda environment), $(TOOLS)/ and data/ (keeps $(SETTINGS_FILE))"

# uv: from PATH, or installed from PyPI into $(TOOLS)/ (sets the shell variable uv); one older
# than $(MIN_UV) stops the build with what to do.
define find_uv
uv=$$(command -v uv || true); \
if [ -z "$$uv" ]; then \
  uv=$(TOOLS)/bin/uv; \
  if [ ! -x "$$uv" ]; then \
    echo "uv not found on PATH: installing it from PyPI into $(TOOLS)/"; \
    $(BOOTSTRAP_PYTHON) -m venv $(TOOLS); \
    $(TOOLS)/bin/pip install --quiet uv; \
  fi; \
fi; \
uv_version=$$("$$uv" --version | awk '{print $$2}'); \
if [ "$$(printf '%s\n%s\n' "$(MIN_UV)" "$$uv_version" | sort -V | head -n 1)" != "$(MIN_UV)" ]; then \
  echo "uv $$uv_version ($$uv) is older than $(MIN_UV), whose --torch-backend (TORCH_BACKEND) is more than a preview: update it" >&2; \
  echo "  (\`uv self update\`, or \`pip install --upgrade uv\`), or take it off PATH and make installs a current one into $(TOOLS)/" >&2; \
  exit 1; \
fi
endef

# The Python to build the environment with must be 3.10 or newer: checked before uv sees it,
# so that a stock Mac (python3 3.9) gets the doctor's advice, not uv's resolver message.
# A PYTHON that is a version for uv to find or fetch (PYTHON=3.12) is left to uv.
define check_python
if command -v "$(PYTHON)" >/dev/null 2>&1 && ! "$(PYTHON)" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then \
  "$(PYTHON)" -m packlab.course.doctor --only Python 2>/dev/null || echo "$(PYTHON) is older than 3.10: see setup.md" >&2; \
  exit 1; \
fi
endef

# torch from PyPI (TORCH_BACKEND=pypi) or from uv's --torch-backend; a backend whose index
# does not answer falls back to PyPI, said out loud and recorded for make doctor (sets backend).
define choose_torch_backend
backend="$(TORCH_BACKEND)"; record="$$backend"; \
if [ -n "$(WHEELHOUSE)" ]; then backend=pypi; record="pypi: from the wheelhouse $(WHEELHOUSE)"; \
elif [ "$$backend" != pypi ] && [ -n "$$backend" ]; then \
  if why=$$($(BOOTSTRAP_PYTHON) -m packlab.course.torch_index "$$backend"); then :; else \
    echo "NOTE: TORCH_BACKEND=$$backend, but $$why."; \
    echo "NOTE: installing PyPI's torch instead; on Linux it brings 3.6 GB of CUDA libraries the course never uses."; \
    echo "NOTE: make doctor shows this; \`make configure TORCH_BACKEND=pypi\` makes it the choice for this checkout."; \
    backend=pypi; record="pypi: fallback from $(TORCH_BACKEND) on $$(date +%F), $$why"; \
  fi; \
fi
endef

# The attendee's environment: the course package and what the chapters and exercises need.
# Nothing is installed when the pinned versions already are (packlab/course/installed.py):
# a release that touches pyproject.toml sends nobody to PyPI at the venue. A conda
# environment (VENV=$$CONDA_PREFIX) is only checked, never installed into.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@set -e; \
	if [ -x "$(PY)" ]; then \
	  status=0; $(PY) -m packlab.course.installed || status=$$?; \
	  if [ $$status -eq 0 ]; then touch $@; exit 0; elif [ $$status -eq 2 ]; then exit 1; fi; \
	fi; \
	$(check_python); \
	$(find_uv); \
	$(choose_torch_backend); \
	"$$uv" venv --allow-existing --python $(PYTHON) $(VENV); \
	if [ "$$backend" = pypi ]; then $(UV_INSTALL) -e .; else UV_TORCH_BACKEND="$$backend" $(UV_INSTALL) -e .; fi; \
	$(UV_INSTALL) --no-deps $$($(PY) -m packlab.course.nodeps); \
	echo "$$record" > $(VENV)/.torch-backend
	@touch $@

# The same plus the book and test tools (pyproject.toml's dev extra) and DALI, chapter 11's peer (the dali extra).
setup-dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: $(VENV)/.installed
	@set -e; \
	status=0; $(PY) -m packlab.course.installed --dev || status=$$?; \
	if [ $$status -eq 0 ]; then touch $@; exit 0; elif [ $$status -eq 2 ]; then exit 1; fi; \
	$(find_uv); \
	$(UV_INSTALL) -e '.[dev,dali]'
	@touch $@

# This checkout's settings, into $(SETTINGS_FILE) (packlab/settings.py); with no NAME=value,
# shows them and where each comes from. An empty value (PACKLAB_COUNT=) removes a setting.
#   make configure PACKLAB_COUNT=2000 PACKLAB_DATA=/scratch/$$USER/packed-data
#   make configure VENV=/scratch/$$USER/packed-venv TORCH_BACKEND=cpu
#   make configure VENV=$$CONDA_PREFIX          (an active conda environment)
#   make configure PACKLAB_CORES=2              (at most 2 cores for the course's workers: a hub's or a job's share)
SETTING_NAMES := PACKLAB_COUNT PACKLAB_DATA VENV TORCH_BACKEND PACKLAB_CORES PACKLAB_CLASS_URL PACKLAB_CLASS_TOKEN
GIVEN_SETTINGS := $(foreach name,$(SETTING_NAMES),$(if $(filter command line,$(origin $(name))),$(name)))
configure:
	@env $(foreach name,$(GIVEN_SETTINGS),-u $(name)) $(BOOTSTRAP_PYTHON) -m packlab.settings \
	  $(foreach name,$(GIVEN_SETTINGS),"$(name)=$($(name))")

data: setup
	$(PY) -m packlab.data

# The Debian packages the tests need (packlab/course/system_deps.py: Chromium for the browser
# tests, slurm-wlm and munge for the Slurm job), installed with one apt-get, before any test
# runs: tests run side by side and two apt-gets at once fail on dpkg's lock. Does nothing when
# they are there; says which tests will skip when it cannot install (fails under CI=true).
# HUB=1: only what the class hub needs (bubblewrap), with the dnf line for RHEL and Rocky.
HUB ?=
system-deps: setup
	$(PY) -m packlab.course.system_deps $(if $(HUB),--hub)

# A go/no-go check of this machine (packlab/course/doctor/); without make, from the
# repository: python3 -m packlab.course.doctor (any Python 3; it says what is missing).
# It sets up and generates the data first (half a minute), so that READY is reachable in one
# step; a data generation that fails does not stop it: the doctor says why on its data line.
doctor: setup
	@$(PY) -m packlab.data || echo "(make data did not finish: see the doctor's data line below)"
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
	$(PY) -m packlab.course.grade $(NB) $(GRADE_ARGS)

# Every attendee's exercise notebooks under CLASS/<attendee>/exercises/, each in a fresh
# kernel in a sandbox (bubblewrap: make system-deps), its checks run again by the grader,
# into CLASS/gradebook.csv, a table, the pass rate of every part and a feedback file per
# attendee in CLASS/feedback/ (see instructor.md, "Grading the whole class").
# GRADE_JOBS=N notebooks at a time (default: one per core); GRADE_ARGS=--no-sandbox without one.
GRADE_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
GRADE_ARGS ?=
gradebook: data
	@test -n "$(CLASS)" || { echo "usage: make gradebook CLASS=folder-with-one-folder-per-attendee"; exit 2; }
	$(PY) -m packlab.course.grade --class $(CLASS) --jobs $(GRADE_JOBS) --summary --feedback $(CLASS)/feedback $(GRADE_ARGS)

# Feedback back to a laptop room: CLASS/handback/NAME.zip for every CLASS/feedback/NAME.md of
# `make gradebook`, the feedback and the graded notebooks under mywork/feedback/. Each attendee
# runs `make feedback ZIP=NAME.zip` in their course folder, which unpacks it there and nowhere
# else. (On the class hub `make gradebook CLASS=hub/dropbox` puts it into their mywork/feedback/ itself.)
handback: setup
	@test -n "$(CLASS)" || { echo "usage: make handback CLASS=folder-graded-by-make-gradebook"; exit 2; }
	$(PY) -m packlab.course.grade.handback --class $(CLASS)

ZIP ?=
feedback: setup
	@test -n "$(ZIP)" || { echo "usage: make feedback ZIP=the-zip-your-instructor-handed-back.zip"; exit 2; }
	$(PY) -m packlab.course.grade.handback --take $(ZIP)

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
test: setup-dev data system-deps hub-proxy
	$(PY) -m packlab.course.testrun --cell-timeout=$(CELL_TIMEOUT) $(if $(TEST_JOBS),--jobs $(TEST_JOBS),)

# Loader speed against the decode ceiling and the peers, the small-file penalty and the
# packed formats (about 30 minutes on two cores).
# Speed targets live here, never in the tests. Run it on an otherwise idle machine.
# BENCH_ARGS=--quick: the same on 600 images, to check that everything runs.
BENCH_ARGS ?=
bench: setup-dev data
	$(PY) -m packlab.course.benchmark $(BENCH_ARGS)

# The course as an OCI image for a centre or a locked-down laptop (container/Containerfile): the
# attendee environment and the small-data dataset, a normal account inside. The base is made
# from Debian's own archive with mmdebstrap; the rest comes from PyPI; no registry image.
# Needs podman and mmdebstrap (Debian packages). container/packed-course.def is the same for
# Apptainer. container-check runs the doctor and chapter 1 in it as the normal account.
container:
	EXTRA_CA_BUNDLE=$(EXTRA_CA_BUNDLE) bash container/build.sh

container-check:
	CONTAINER_RUN=$(CONTAINER_RUN) bash container/check.sh

# Simulated attendees on a real class hub, through its REST and kernel APIs: start times, cell
# times, verdicts, peak memory, every check on the board (packlab/course/hub/loadtest.py).
# A measurement: run it on an otherwise idle machine.
loadtest: setup-dev hub-proxy
	$(PY) -m packlab.course.hub.loadtest --attendees $(or $(ATTENDEES),2) --cores-per-attendee $(or $(CORES_PER_ATTENDEE),1) $(LOADTEST_ARGS) --out $(or $(OUT),_build/loadtest)

# The attendees' copy of the course: every tracked file but solutions/ and the tests, the
# notebooks' headers as the pinned jupytext saves them, committed into the git repository
# DEST (created if needed; a release into an existing one is a new commit attendees pull).
SOLUTIONS ?=
release: setup
	@test -n "$(DEST)" || { echo "usage: make release DEST=path/to/attendee-repository [SOLUTIONS=01_jpeg_dataset,03]"; exit 2; }
	$(PY) -m packlab.course.release release $(DEST) $(if $(SOLUTIONS),--solutions "$(SOLUTIONS)")

# An attendee's exercises (mywork/, else exercises/), packed the way `make gradebook` reads
# them: submissions/NAME/exercises/*.md and submissions/NAME.zip holding NAME/exercises/.
# SUBMIT_FROM=folder and SUBMIT_TO=folder change where the notebooks come from and go.
# On the class hub (PACKLAB_HUB set by its spawner) the environment is the hub's, and
# the drop folder takes the folder alone: SUBMIT_TO and NAME come from the hub.
NAME ?= $(USER)
SUBMIT_FROM ?=
SUBMIT_TO ?=
submit: $(if $(PACKLAB_HUB),,setup)
	$(PY) -m packlab.course.release submit --name "$(NAME)" $(if $(SUBMIT_FROM),--from "$(SUBMIT_FROM)") $(if $(SUBMIT_TO),--out "$(SUBMIT_TO)") $(if $(PACKLAB_HUB),--folder-only)

# The instructor's latest release, with whatever you changed kept: your changes to
# tracked files are put aside (git stash), the release is pulled (fast-forward only), and
# your changes are put back; when they cannot be, it says so and what to do. Your work in
# mywork/ is git-ignored and never touched. Needs nothing but git.
update:
	@$(BOOTSTRAP_PYTHON) -m packlab.course.update

# A JupyterHub for a class on this machine (packlab/course/hub/): every name on CLASS_LIST
# (one a line; "NAME instructor" for instructors) gets an account and, at first login, a
# clone of the release in hub/users/NAME/course with mywork/ made, the dataset read-only
# (small-data mode), in a sandbox; the board for instructors is at /services/board/.
# HUB_DIR: the hub's folder; HUB_URL: where it listens (http://0.0.0.0:8000 for a room);
# HUB_ARGS: more options (python -m packlab.course.hub --help).
CLASS_LIST ?=
HUB_DIR ?= hub
HUB_URL ?= http://127.0.0.1:8000
HUB_ARGS ?=
hub: setup-dev hub-proxy
	@test -n "$(CLASS_LIST)" || { echo "usage: make hub CLASS_LIST=class.txt (one name a line; 'NAME instructor' for instructors)"; exit 2; }
	$(PY) -m packlab.course.hub --class-list $(CLASS_LIST) --dir $(HUB_DIR) --url $(HUB_URL) $(HUB_ARGS)

# JupyterHub's proxy, configurable-http-proxy, from npm into $(TOOLS)/chp (never global;
# no lock file is written). Needs node 20 or newer.
CHP_VERSION := 5.3.0
hub-proxy: $(TOOLS)/chp/node_modules/.bin/configurable-http-proxy

$(TOOLS)/chp/node_modules/.bin/configurable-http-proxy:
	@found=$$(node --version 2>/dev/null); major=$${found#v}; major=$${major%%.*}; \
	  if [ -z "$$found" ] || ! [ "$$major" -ge 20 ] 2>/dev/null; then \
	    echo "make hub needs node 20 or newer for configurable-http-proxy; found: $${found:-no node on PATH}."; \
	    echo "Debian 12's and Ubuntu 24.04's nodejs package is node 18: take node 20 or newer from nodejs.org (or NodeSource's packages)."; exit 1; fi
	@command -v npm >/dev/null || { echo "make hub needs npm beside node 20 or newer (nodejs.org's node comes with it)"; exit 1; }
	npm install --prefix $(TOOLS)/chp --no-package-lock --no-save --no-fund --no-audit configurable-http-proxy@$(CHP_VERSION)

# The live board of a class folder of check runs (PACKLAB_CLASS_RECORDS), without a hub:
# on BOARD_HOST:BOARD_PORT, with ROSTER (a class list) for who has not started. It also takes
# records posted with the class token (BOARD_TOKEN, else one made and printed): in a laptop
# room, BOARD_HOST=0.0.0.0 and each attendee's `make configure PACKLAB_CLASS_URL=... PACKLAB_CLASS_TOKEN=...`
# (the board prints the line). Beyond 127.0.0.1 the page wants the token too (?token= once).
RECORDS ?=
ROSTER ?=
BOARD_HOST ?= 127.0.0.1
BOARD_PORT ?= 8765
BOARD_TOKEN ?=
board: setup
	@test -n "$(RECORDS)" || { echo "usage: make board RECORDS=class-folder [ROSTER=class.txt] [BOARD_HOST=0.0.0.0] [BOARD_TOKEN=...]"; exit 2; }
	@BOARD_TOKEN='$(BOARD_TOKEN)' $(PY) -m packlab.course.hub.board --records $(RECORDS) --host $(BOARD_HOST) --port $(BOARD_PORT) $(if $(ROSTER),--roster $(ROSTER))

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
	@packed="$(or $(PACKLAB_DATA),data)/packed"; \
	if [ -d "$$packed" ]; then du -sh "$$packed"; rm -rf "$$packed"; echo "removed $$packed"; \
	else echo "nothing to remove: $$packed does not exist"; fi

# Keeps $(SETTINGS_FILE), a data folder outside the repository and a conda environment.
distclean: clean
	@if [ -d "$(VENV)/conda-meta" ]; then echo "kept $(VENV): a conda environment"; else rm -rf $(VENV); echo "removed $(VENV)"; fi
	rm -rf $(TOOLS) data
	@if [ -n "$(PACKLAB_DATA)" ]; then echo "kept $(PACKLAB_DATA) (PACKLAB_DATA): remove it yourself if you want it gone"; fi

# Every wheel `make setup` installs, for this platform and Python, into WHEELHOUSE (default
# wheelhouse/): made at home, on a good network, on one machine of each kind the room brings
# (Linux x86_64, macOS arm64; into the same folder). At the venue, without network:
#   make setup WHEELHOUSE=/media/usb/wheelhouse
# installs from that folder alone (uv --offline --no-index --find-links). pip downloads them
# (uv has no download command), --isolated: from PyPI as uv sees it, whatever a pip.conf adds.
# On Linux torch comes from PyTorch's CPU index where reachable.
wheelhouse: WHEELHOUSE := $(or $(WHEELHOUSE),wheelhouse)
wheelhouse:
	@set -e; $(find_uv); \
	backend="$(TORCH_BACKEND)"; extra=""; \
	if [ "$$backend" != pypi ] && [ -n "$$backend" ]; then \
	  if $(BOOTSTRAP_PYTHON) -m packlab.course.torch_index "$$backend"; then extra="--extra-index-url $$($(BOOTSTRAP_PYTHON) -m packlab.course.torch_index --index-url $$backend)"; \
	  else echo "NOTE: so torch comes from PyPI, with its CUDA libraries"; fi; \
	fi; \
	mkdir -p "$(WHEELHOUSE)"; \
	pip="$$uv tool run --python $(PYTHON) --from pip pip --isolated"; \
	$$pip download --dest "$(WHEELHOUSE)" $$extra $$($(BOOTSTRAP_PYTHON) -m packlab.course.installed --wheelhouse-requirements); \
	$$pip download --dest "$(WHEELHOUSE)" --no-deps $$($(BOOTSTRAP_PYTHON) -m packlab.course.nodeps); \
	du -sh "$(WHEELHOUSE)"; echo "at the venue: make setup WHEELHOUSE=$$(cd "$(WHEELHOUSE)" && pwd)"
