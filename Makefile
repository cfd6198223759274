PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint format migrations-check vendor

run: $(VENV)/.installed static/vendor/.installed
	$(PY) scripts/run.py

test: $(VENV)/.installed-dev static/vendor/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) manage.py makemigrations --check --dry-run
	sh scripts/ensure_chromium.sh
	$(VENV)/bin/pytest

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

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

# Front-end libraries come from the npm registry at install time (versions pinned in
# package-lock.json) and are served from static/vendor; nothing loads from a CDN.
vendor: static/vendor/.installed

static/vendor/.installed: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is needed once to fetch the front-end libraries: apt-get install npm (or brew install node)"; exit 1; }
	npm ci --no-audit --no-fund --loglevel=error
	mkdir -p static/vendor
	cp node_modules/htmx.org/dist/htmx.min.js node_modules/htmx-ext-ws/dist/ws.min.js \
	   node_modules/cytoscape/dist/cytoscape.min.js node_modules/markdown-it/dist/markdown-it.min.js \
	   node_modules/dompurify/dist/purify.min.js node_modules/axe-core/axe.min.js \
	   node_modules/layout-base/layout-base.js node_modules/cose-base/cose-base.js \
	   node_modules/cytoscape-fcose/cytoscape-fcose.js static/vendor/
	touch $@
