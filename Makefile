# The two commands of the README: `make lab` and `make test`. Both bootstrap .venv themselves,
# from the lock files: `make lab` installs only what the lab needs, `make test` adds the dev tools.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
PYTHON_STAMP := $(VENV)/.python
LAB_STAMP := $(VENV)/.lab-installed
DEV_STAMP := $(VENV)/.dev-installed
# `make lab PORT=8890 DB_PORT=54400`: JupyterLab's port and the embedded server's. Only from
# make's command line: a PORT exported for some web application must not move the lab.
LAB_ARGS := $(if $(filter command line,$(origin PORT)),--port $(PORT)) \
            $(if $(filter command line,$(origin DB_PORT)),--db-port $(DB_PORT))

# A Python >= 3.12: python3.13, python3.12, python3, one that uv or pyenv installed.
FIND_PYTHON := for c in python3.14 python3.13 python3.12 python3 \
    $$(command -v uv >/dev/null 2>&1 && uv python find '>=3.12' 2>/dev/null) \
    $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do \
  if "$$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then \
    command -v "$$c"; exit 0; fi; done; exit 1

.PHONY: help venv lab test bench reproduce lint lock clean

help:
	@echo "make lab        start PostgreSQL 17 (embedded, or TENANTLAB_DATABASE_URL) and JupyterLab on notebooks/"
	@echo "                (PORT=N: JupyterLab's port; DB_PORT=N: the embedded server's)"
	@echo "make test       run the whole test suite (the kit's, then jobqueue's own)"
	@echo "make reproduce  regenerate the article's findings (reproduce.json, report.html, README matrix)"
	@echo "make bench      benchmarks (not tests)"
	@echo "make lock       regenerate requirements.lock and requirements-dev.lock (uv pip compile)"
	@echo "make clean      stop the embedded server, remove .venv and all local state"

$(PYTHON_STAMP):
	@py="$$($(FIND_PYTHON))" || { \
	  echo "tenantlab needs Python 3.12 or newer, and none was found (tried python3.14..python3, uv, pyenv)." >&2; \
	  echo "Install one: 'uv python install 3.12' (uv: see docs.astral.sh/uv), 'pyenv install 3.12'," >&2; \
	  echo "'brew install python@3.12' (macOS), 'apt install python3.12-venv' (Ubuntu 24.04; Debian 12 has only 3.11)." >&2; \
	  exit 1; }; \
	echo "using $$py ($$("$$py" --version))"; \
	if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
	  rm -rf $(VENV) && "$$py" -m venv $(VENV); fi
	$(PIP) --upgrade pip
	@touch $(PYTHON_STAMP)

# The lab: the locked runtime dependencies (with ./jobqueue, editable: the lock files name it), the
# package itself, and the notebook output filter.
$(LAB_STAMP): $(PYTHON_STAMP) requirements.lock pyproject.toml jobqueue/pyproject.toml
	$(PIP) -r requirements.lock
	$(PIP) --no-deps -e .
	@$(MAKE) --no-print-directory strip-outputs
	@touch $(LAB_STAMP)

$(DEV_STAMP): $(LAB_STAMP) requirements-dev.lock
	$(PIP) -r requirements-dev.lock
	@touch $(DEV_STAMP)

# Git sees notebooks as stored (.gitattributes names the filter): what JupyterLab ran and saved
# neither shows in `git diff` nor blocks a `git pull`; nbconvert's saves (`--execute --inplace`)
# get the same post-save refresh as JupyterLab's (tenantlab/gitsave.py). tenantlab.labenv installs
# the notebooks' kernel "tenantlab" and JupyterLab's defaults into .venv (not ~/.local). tools/setup_git_filter.sh (docker compose
# and the conda steps use it too) configures tools/strip_outputs.py, which needs only python3.
.PHONY: strip-outputs
strip-outputs:
	@sh tools/setup_git_filter.sh
	@if [ -x $(PY) ]; then $(PY) -m tenantlab.gitsave; fi
	@if [ -x $(PY) ]; then $(PY) -m tenantlab.labenv; fi

venv: $(DEV_STAMP)

lab: $(LAB_STAMP)
	$(VENV)/bin/tenantlab lab $(LAB_ARGS)

# Two pytest-xdist workers (most tests wait on workers, locks and timers, not on the CPU), each
# file on one worker, each worker with an embedded server of its own (tests/conftest.py).
# TEST_WORKERS=0: one process; the default with TENANTLAB_DATABASE_URL, a server they would share.
TEST_WORKERS ?= $(if $(TENANTLAB_DATABASE_URL),0,2)
test: $(DEV_STAMP)
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-jobqueue

# The queue's own suite (jobqueue/tests), on databases its own `migrate` makes, on the kit's
# server (started for it, and stopped after, unless it ran already).
.PHONY: test-jobqueue
test-jobqueue: $(DEV_STAMP)
	$(PY) tools/jobqueue_suite.py

# Every finding five times: the README's matrix and FINDINGS.md state the ranges of this run.
REPEAT ?= 5
reproduce: $(LAB_STAMP)
	@mkdir -p docs
	$(VENV)/bin/tenantlab reproduce --repeat $(REPEAT) --json docs/reproduce.json --report report.html
	$(VENV)/bin/python tools/findings_matrix.py docs/reproduce.json
	$(VENV)/bin/python tools/findings_doc.py

bench: $(LAB_STAMP)
	$(VENV)/bin/tenantlab bench --json bench.json
	$(PY) tools/bench_table.py bench.json

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check tenantlab tests jobqueue
	$(VENV)/bin/mypy tenantlab
	cd jobqueue && ../$(VENV)/bin/mypy

# Same versions for a room of laptops: resolved once for every platform, installed by make.
lock: $(PYTHON_STAMP)
	$(PIP) "uv>=0.5,<1"
	$(VENV)/bin/uv pip compile pyproject.toml --universal --python-version 3.12 --upgrade \
	  --quiet -o requirements.lock
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --universal --python-version 3.12 \
	  --upgrade --quiet -c requirements.lock -o requirements-dev.lock

# Everything the kit put on the machine for this checkout: its state wherever it lives
# (.tenantlab, /var/lib/tenantlab/home-* for a root checkout the server user cannot enter, or
# TENANTLAB_HOME), with the copy of PostgreSQL's binaries made for the server user, then .venv.
# `tenantlab down --purge` stops the server and PgBouncer first, and refuses, naming them, while a
# lab runs, a JupyterLab outlived its lab (an orphan: `kill` it), or a server runs in a state
# directory inside (the test suite's .tenantlab/gw1: `make test` still running, or interrupted);
# without .venv, tools/clean_state.py (standard library only) removes the same paths.
clean:
	@if [ -x $(VENV)/bin/tenantlab ]; then $(VENV)/bin/tenantlab down --purge || exit 1; \
	elif command -v python3 >/dev/null; then python3 tools/clean_state.py || exit 1; fi
	rm -rf $(VENV) .tenantlab tenantlab.egg-info notebooks/.ipynb_checkpoints
