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

.PHONY: help setup book test clean

help:
	@echo "make book   set up .venv (once) and build the book into _build/html, executing every chapter"
	@echo "make test   set up .venv (once) and run the whole test suite (includes a real book build)"
	@echo "make clean  remove _build (the built book and the execution cache)"

setup: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	@echo "==> Setting up the virtual environment in $(VENV) (first time: a few minutes, ~6 GB)"
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "==> Installing requirements.txt"
	$(PY) -m pip install --quiet -r requirements.txt
	@echo "==> Installing requirements-nodeps.txt without its pins (d2l)"
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	@echo "==> Installing the course's helper package (dlperf) in editable mode"
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)
	@echo "==> Environment ready"

book: setup
	@echo "==> Building the book (cached chapters are not executed again)"
	$(PY) -m dlperf.book

test: setup
	@echo "==> Running the test suite"
	$(PY) -m pytest

clean:
	rm -rf _build
