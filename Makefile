PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint format migrations-check ci

run: $(VENV)/.installed
	$(PY) scripts/run.py

test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/pytest

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/.installed-dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

migrations-check: $(VENV)/.installed
	$(PY) manage.py makemigrations --check --dry-run

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@
