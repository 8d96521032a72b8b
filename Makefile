# Two commands do all the set-up on a fresh machine:
#   make run    the control plane on the embedded default (SQLite + a SQLite-backed broker) at http://127.0.0.1:8000
#   make test   the whole suite (PostgreSQL when DATABASE_URL is set, else SQLite, skipping visibly what needs PG)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run serve test lint format migrate bench model clean

# The server with its dev tools, and the worker SDK (its own distribution, clients/python) that the tests use.
$(BIN)/.installed: pyproject.toml clients/python/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e 'clients/python[django]'
	touch $@

migrate: $(BIN)/.installed
	$(BIN)/python manage.py migrate --no-input -v 0

# The server, plus a Celery worker with beat for the jobs (dispatch delivery, lease reaping, drain checks, …),
# stopped together.
run: migrate
	@echo "claim control plane on http://$(HOST):$(PORT)/api/v1/docs/  (tokens: $(BIN)/python manage.py issue_token --role worker --name w1)"
	@$(BIN)/celery -A controlplane worker --beat --pool solo --loglevel WARNING & \
	  worker=$$!; trap 'kill $$worker 2>/dev/null' EXIT INT TERM; \
	  $(BIN)/python manage.py runserver $(HOST):$(PORT)

# The production profile on one host: gunicorn with WEB_CONCURRENCY uvicorn workers (ASGI: a waiting claim holds
# no thread; pooled connections), exactly one Celery beat, and CELERY_WORKERS Celery workers — stopped together.
# Needs DATABASE_URL=postgres://… and CELERY_BROKER_URL=redis://… or amqp://… (docs/deployment.md); BIND (default
# 127.0.0.1:8000). Several hosts: run the server and workers on each, and beat on one only.
CELERY_WORKERS ?= 2
serve: migrate
	@trap 'kill 0' EXIT INT TERM; \
	  $(BIN)/celery -A controlplane beat --loglevel INFO --schedule var/celerybeat-schedule & \
	  for i in $$(seq 1 $(CELERY_WORKERS)); do \
	    $(BIN)/celery -A controlplane worker --loglevel INFO --hostname worker$$i@%h & \
	  done; \
	  DATABASE_POOL=true $(BIN)/gunicorn -c deploy/gunicorn.conf.py controlplane.asgi:application

# Browser tests need Debian's chromium; scripts/install-browser.sh installs it when it can (root), otherwise those
# tests are skipped with a message saying so.
# The whole suite, then the core's and the on-call tools' tests again without the rollout app
# (controlplane.settings.test_core): deleting rollout/ and its URL lines leaves a working claim.v1 service with its
# on-call tools.
test: lint
	-@scripts/install-browser.sh
	-@scripts/install-node.sh
	-@scripts/install-topology.sh
	-@scripts/install-mysql-client.sh
	$(BIN)/pytest
	$(BIN)/pytest tests/claims tests/oncall --ds=controlplane.settings.test_core -p no:cacheprovider

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
