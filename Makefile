# The two commands of the README: `make book` and `make test`.
# Both create (once) a virtual environment in .venv with everything pinned in
# requirements*.txt, then build the book or run the whole test suite.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help setup lock book instructor-book gpu-status gpu-kit gpu-rehearsal browser hub-proxy test check clean

help:
	@echo "make book             set up .venv (once) and build the book into _build/html, executing every chapter"
	@echo "make instructor-book  the same book plus solutions and grading guide, into _build/instructor"
	@echo "make gpu-status       on a GPU machine: run every chapter afresh and record it in status/gpu-runs.json"
	@echo "make gpu-kit          download into _build/gpu-kit the wheels an offline GPU machine needs for"
	@echo "                      scripts/gpu-run (the chapters, the grader and the GPU tests there)"
	@echo "make test             set up .venv (once) and run the test suite but the GPU kit's rehearsal (it includes"
	@echo "                      a real book build and a headless Chromium walking it; Chromium is installed with"
	@echo "                      apt-get if missing, and JupyterHub's proxy with npm into _build/hub-proxy)"
	@echo "make gpu-rehearsal    the GPU kit rehearsed on a CPU: a second environment (Python 3.12, PyTorch 2.11,"
	@echo "                      what the GPU machines have) runs scripts/gpu-run and dlperf's tests; CI runs it"
	@echo "                      after make test (tests/test_gpu_kit.py, pytest -m gpu_kit)"
	@echo "make lock             pin every package of requirements*.txt (Python 3.12, x86-64 Linux) in"
	@echo "                      requirements.lock, keeping its other pins (UPGRADE=1: the newest allowed);"
	@echo "                      the Gradescope zip installs with it (guide/gradescope-install.md)"
	@echo "make check            the everyday tier: unit tests and the fast grader tests, no book build and no"
	@echo "                      real assignment graded (pytest -m 'not integration'; a few minutes)"
	@echo "make clean            remove _build (the built book and the execution cache)"

setup: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	@echo "==> Setting up the virtual environment in $(VENV) (first time: a minute or more, ~6 GB)"
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv
	@echo "==> Installing requirements.txt (with uv, given pip's settings: scripts/install.py)"
	$(PY) scripts/install.py --quiet --compile-bytecode -r requirements.txt
	@echo "==> Installing requirements-nodeps.txt without its pins (d2l)"
	$(PY) scripts/install.py --quiet --no-deps -r requirements-nodeps.txt
	@echo "==> Installing the course's helper package (dlperf) in editable mode"
	$(PY) scripts/install.py --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)
	@echo "==> Environment ready"

# After adding a line to requirements.txt: pins the new package, leaves the other pins alone
lock: setup
	$(PY) scripts/lock.py $(if $(UPGRADE),--upgrade)

book: setup
	@echo "==> Building the book (cached chapters are not executed again)"
	$(PY) -m coursebook

instructor-book: setup
	@echo "==> Building the instructor edition (solutions, hidden tests, grading guide; never publish it)"
	$(PY) -m coursebook --instructor

gpu-status: setup
	@echo "==> Running every chapter on this machine's GPU(s) and recording the runs in status/gpu-runs.json"
	$(PY) -m coursebook.status record

gpu-kit: setup
	@echo "==> Downloading the wheels an offline GPU machine (Python 3.12, PyTorch 2.11) lacks"
	$(PY) scripts/gpu_kit.py

# Debian's chromium for tests/test_book_browser.py: installed with apt-get when missing and
# possible (root or passwordless sudo); otherwise a warning, and that test is skipped.
browser: setup
	@$(PY) -m tests.browser --install

# npm's configurable-http-proxy, JupyterHub's proxy, for tests/test_autograder_service_hub.py:
# installed into _build/hub-proxy when missing and npm is there; otherwise a warning, and that
# test is skipped.
hub-proxy: setup
	@$(PY) -m tests.hub --install

test: setup browser hub-proxy
	@echo "==> Running the test suite (the GPU kit's rehearsal is make gpu-rehearsal)"
	$(PY) -m pytest -m "not gpu_kit"

# The lowest PyTorch the course supports and the offline GPU machines' run, on a CPU: its own
# environment (about 5 GB) and a second run of every chapter, so a tier of its own, like the
# lowest-version entry of a CI matrix. CI runs it after `make test`.
gpu-rehearsal: setup
	@echo "==> Rehearsing the GPU kit on the PyTorch 2.11 stand-in (_build/gpu-stand-in)"
	$(PY) -m pytest -m gpu_kit

# Everyday work: everything not marked integration (tests/conftest.py also marks every test that
# needs the built book). `make test` stays the whole suite but the GPU kit's rehearsal.
check: setup
	@echo "==> Running the quick tier (unit tests and fast grader tests; make test runs everything else)"
	$(PY) -m pytest -m "not integration"

clean:
	rm -rf _build
