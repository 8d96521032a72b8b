"""Fuzzing the REST API from its own OpenAPI schema (schemathesis): no 5xx for anything a client can send,
every response is one the schema documents, and a refused request (400/401/403/404) changes no record.

The CI run is short (FUZZ_EXAMPLES per operation, default 12); `FUZZ_EXAMPLES=300 make test` is a long run."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from claims.models import Attempt, AuditEntry, Effect, Namespace, StagedResult, Task, TaskEvent
from controlplane.wsgi import application
from tests.support.actors import ensure_default_namespace, make_actor

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))

# Operations only an operator or oncall may call (oncall may do all an operator may).
OPERATOR_PATHS = (
    "/fence",
    "/resume",
    "/rollout/advance",
    "/rollout/rollback",
    "/explain-rules",
    "/coverage/waive",
    "/review",
    "/approve",
    "/cancel",
    "/requeue",
    "/input",
    "/audit",
)


def _counts() -> tuple:
    return (
        Task.objects.count(),
        Attempt.objects.count(),
        StagedResult.objects.count(),
        Effect.objects.count(),
        Namespace.objects.count(),
        TaskEvent.objects.exclude(kind="fenced").count(),
        AuditEntry.objects.count(),
    )


@pytest.fixture
def wsgi_in_test_transaction(tokens):
    """Calling the WSGI app directly fires request_started/finished, which would close the test's connection
    (and its transaction); Django's test client disconnects the same handler for its own requests (and connects
    it again afterwards, so this runs after the setup's test-client calls)."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield tokens
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def tokens(db):
    ensure_default_namespace()
    worker, oncall, operator = (
        make_actor("fuzz-worker", "worker"),
        make_actor("fuzz-oncall", "oncall"),
        make_actor("fuzz-operator", "operator"),
    )
    operator.create(task_id="t-1", node_id="n")
    return {"worker": worker.token, "oncall": oncall.token}


@pytest.mark.timeout(
    120 + EXAMPLES * 3
)  # the long run (FUZZ_EXAMPLES=300) outlasts the suite's 120 s per test
def test_no_request_breaks_the_server_or_changes_records_when_refused(wsgi_in_test_transaction):
    tokens = wsgi_in_test_transaction
    # Loaded here, not at import: a request made at collection time would run against the wrong database.
    schema = schemathesis.openapi.from_wsgi("/api/v1/schema/?format=json", application)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 40
    statuses: list[int] = []

    for operation in operations:

        @settings(
            max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=operation.as_strategy())
        def exercise(case):
            role = (
                "oncall"
                if case.path.endswith(OPERATOR_PATHS) or case.method.upper() == "DELETE"
                else "worker"
            )
            before = _counts()
            response = case.call(headers={"Authorization": f"Bearer {tokens[role]}"})
            statuses.append(response.status_code)
            assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:300]}"
            case.validate_response(
                response, checks=[not_a_server_error, status_code_conformance, response_schema_conformance]
            )
            if response.status_code in (400, 401, 403, 404):
                assert _counts() == before, (
                    f"{case.method} {case.path} answered {response.status_code} but changed records"
                )

        exercise()
    assert len(statuses) >= len(operations)
