# Two commands do all the set-up on a fresh machine:
#   make run    the control plane on the embedded default (SQLite + a SQLite-backed broker) at http://127.0.0.1:8000
#   make test   the whole suite (PostgreSQL when DATABASE_URL is set, else SQLite, skipping visibly what needs PG)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run serve test lint format migrate bench model clean screenshots schema

# What running needs, and nothing else (the package and its pinned dependencies, and the worker SDK the README's
# example worker uses: no test or lint tool).
$(BIN)/.runtime: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e . -e clients/python
	touch $@

# The server with its dev tools, and the worker SDK (its own distribution, clients/python) that the tests use.
$(BIN)/.installed: pyproject.toml clients/python/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e 'clients/python[django]'
	touch $@ $(BIN)/.runtime

migrate: $(BIN)/.runtime
	$(BIN)/claimctl migrate --no-input -v 0

# The embedded default: the server, a Celery worker and beat, supervised by `claimctl run` (controlplane/supervise.py):
# one Ctrl-C or SIGTERM stops all three, each with one line.
run: $(BIN)/.runtime
	@HOST=$(HOST) PORT=$(PORT) exec $(BIN)/claimctl run

# The production profile on one host: gunicorn with WEB_CONCURRENCY uvicorn workers (ASGI: a waiting claim holds
# no thread; pooled connections), CELERY_WORKERS Celery workers and exactly one beat, supervised by `claimctl up`.
# Needs DATABASE_URL=postgres://… and CELERY_BROKER_URL=redis://… or amqp://… (it refuses to start without them;
# docs/deployment.md); BIND (default HOST:PORT). Several hosts: `claimctl serve` and `claimctl worker` on each,
# `claimctl beat` on one only.
CELERY_WORKERS ?= 2
serve: $(BIN)/.runtime
	@DATABASE_POOL=true HOST=$(HOST) PORT=$(PORT) exec $(BIN)/claimctl up --workers $(CELERY_WORKERS)

# Browser tests need Debian's chromium; scripts/install-browser.sh installs it when it can (root), otherwise those
# tests are skipped with a message saying so.
# The whole suite, then the core's, the on-call tools' and the gateway's tests again with the rollout app uninstalled
# (controlplane.settings.test_core leaves it out; tests/support/without_rollout.py makes it unimportable, for the
# product and the tests alike): deleting rollout/ leaves a working claim.v1 service, its on-call tools and gateway.
# Two test processes (pytest-xdist; tests/support/parallel.py says what they share), then the serial tests alone
# (those that follow a legacy change stream or restart PostgreSQL).
TEST_PROCESSES ?= 2
test: lint
	-@scripts/install-browser.sh
	-@scripts/install-node.sh
	-@scripts/install-topology.sh
	-@scripts/install-mysql-client.sh
	-@scripts/install-mcp-servers.sh
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadgroup -m "not serial" --durations=30
	$(BIN)/pytest -m serial -p no:cacheprovider
	$(BIN)/python -m pytest tests/claims tests/oncall tests/gateway --ds=controlplane.settings.test_core \
		-p tests.support.without_rollout -p no:cacheprovider -n $(TEST_PROCESSES) --dist loadgroup

# The OpenAPI schema the clients are built from (clients/openapi.json; a test fails when it is stale).
schema: $(BIN)/.runtime
	$(BIN)/claimctl manage spectacular --format openapi-json --file clients/openapi.json

# The console's screenshots for docs/operations.md, taken by the browser tests (which otherwise write them to a
# temporary folder: `make test` leaves the clone as it found it).
screenshots: $(BIN)/.installed
	-@scripts/install-browser.sh
	CONSOLE_SCREENSHOTS=docs $(BIN)/pytest tests/e2e -p no:cacheprovider

# ruff; import-linter's contracts (the core never imports the on-call tools or the rollout, the on-call tools never
# the rollout; layers; no import circle anywhere); mypy with django-stubs and djangorestframework-stubs.
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: $(BIN)/.installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The claim protocol's Promela model, checked exhaustively by Spin (Debian's spin; docs/model.md): the model of the
# code and each deliberately broken variant.
model: $(BIN)/.installed
	$(BIN)/pytest tests/model -s -p no:cacheprovider

bench: $(BIN)/.installed
	$(BIN)/pip install --quiet '.[bench]'
	$(BIN)/python bench/sidebyside.py

clean:
	rm -rf $(VENV) var .pytest_cache
