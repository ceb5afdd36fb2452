# The two commands of the README: `make lab` and `make test`. Both bootstrap .venv themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
STAMP := $(VENV)/.installed
PY := $(VENV)/bin/python

# A Python >= 3.12: python3.13, python3.12, python3, then any pyenv-installed 3.12+.
FIND_PYTHON := for c in python3.13 python3.12 python3 \
    $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do \
  if "$$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then \
    command -v "$$c"; exit 0; fi; done; exit 1

.PHONY: help venv lab test bench reproduce lint clean

help:
	@echo "make lab        start PostgreSQL 17 (embedded, or DATABASE_URL) and JupyterLab on notebooks/"
	@echo "make test       run the whole test suite"
	@echo "make reproduce  regenerate the article's findings (reproduce.json, report.html, README matrix)"
	@echo "make bench      benchmarks (not tests)"
	@echo "make clean      stop the embedded server, remove .venv and .tenantlab"

$(STAMP): pyproject.toml
	@py="$$($(FIND_PYTHON))" || { \
	  echo "tenantlab needs Python 3.12 or newer, and none was found (tried python3.13, python3.12, python3, pyenv)." >&2; \
	  echo "Install one: e.g. 'apt install python3.12 python3.12-venv', 'brew install python@3.12', or 'pyenv install 3.12'." >&2; \
	  exit 1; }; \
	echo "using $$py ($$("$$py" --version))"; \
	if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
	  rm -rf $(VENV) && "$$py" -m venv $(VENV); fi
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/tenantlab lab

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

reproduce: $(STAMP)
	$(VENV)/bin/tenantlab reproduce --json reproduce.json --report report.html
	$(PY) tools/findings_matrix.py reproduce.json

bench: $(STAMP)
	$(VENV)/bin/tenantlab bench

lint: $(STAMP)
	$(VENV)/bin/ruff check tenantlab tests
	$(VENV)/bin/mypy tenantlab

clean:
	-[ -x $(VENV)/bin/tenantlab ] && $(VENV)/bin/tenantlab down
	rm -rf $(VENV) .tenantlab
