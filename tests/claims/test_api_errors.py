"""401 / 403 / 400 / 404 on every endpoint, in the contract's order, and nothing changes."""

from __future__ import annotations

import pytest

from claims.models import Attempt, DispatchIntent, Namespace, StagedResult, Task, TaskEvent

WORKER_POSTS = [
    "/tasks/{t}/claim",
    "/claims",
    "/tasks/{t}/renew",
    "/tasks/{t}/release",
    "/tasks/{t}/results",
    "/tasks/{t}/commit",
]
OPERATOR_POSTS = ["/tasks/{t}/input", "/tasks/{t}/cancel", "/tasks/{t}/requeue", "/namespaces"]
ONCALL_POSTS = ["/namespaces/default/fence", "/namespaces/default/resume"]
GETS = ["/tasks", "/tasks/{t}", "/tasks/{t}/events", "/namespaces", "/namespaces/default"]


def _snapshot():
    return (
        list(Task.objects.order_by("pk").values()),
        Attempt.objects.count(),
        StagedResult.objects.count(),
        TaskEvent.objects.count(),
        list(Namespace.objects.order_by("pk").values()),
    )


@pytest.mark.parametrize("path", WORKER_POSTS + OPERATOR_POSTS + ONCALL_POSTS + ["/tasks"])
def test_no_token_is_401(anonymous, ready_task, path):
    before = _snapshot()
    response = anonymous.post("/api/v1" + path.format(t=ready_task), {}, format="json")

    assert response.status_code == 401 and response.json()["outcome"] == "UNAUTHENTICATED"
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert _snapshot() == before


@pytest.mark.parametrize("path", GETS)
def test_reads_need_a_token_too(anonymous, ready_task, path):
    assert anonymous.get("/api/v1" + path.format(t=ready_task)).status_code == 401


def test_an_unknown_token_is_401(anonymous, ready_task):
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer cp_not-a-real-token")
    assert anonymous.get(f"/api/v1/tasks/{ready_task}").status_code == 401
    anonymous.credentials(HTTP_AUTHORIZATION="Basic dXNlcjpwYXNz")
    assert anonymous.get(f"/api/v1/tasks/{ready_task}").status_code == 401


@pytest.mark.parametrize("path", WORKER_POSTS)
def test_only_workers_claim_renew_release_stage_and_commit(operator, oncall, ready_task, path):
    before = _snapshot()
    for actor in (operator, oncall):
        response = actor.post(path.format(t=ready_task), {})  # role is judged before the body
        assert response.status_code == 403 and response.json()["outcome"] == "FORBIDDEN"
    assert _snapshot() == before


@pytest.mark.parametrize("path", OPERATOR_POSTS + ONCALL_POSTS)
def test_workers_may_not_do_operator_or_oncall_actions(worker_a, ready_task, path):
    before = _snapshot()
    assert worker_a.post(path.format(t=ready_task), {}).status_code == 403
    assert _snapshot() == before


@pytest.mark.parametrize("path", GETS)
def test_every_role_may_read(worker_a, operator, oncall, ready_task, path):
    for actor in (worker_a, operator, oncall):
        assert actor.get(path.format(t=ready_task)).status_code == 200


BAD_BODIES = [
    (
        "/tasks/{t}/claim",
        {"owner_id": "worker-a", "scheduler_epoch": "1", "ttl_seconds": 30},
        "scheduler_epoch",
    ),
    (
        "/tasks/{t}/claim",
        {"owner_id": "worker-a", "scheduler_epoch": True, "ttl_seconds": 30},
        "scheduler_epoch",
    ),
    ("/tasks/{t}/claim", {"owner_id": "worker-a", "scheduler_epoch": 1}, "ttl_seconds"),
    (
        "/tasks/{t}/claim",
        {"owner_id": "worker-a", "scheduler_epoch": 1, "ttl_seconds": 30, "expected_state_verison": 1},
        "expected_state_verison",
    ),
    (
        "/tasks/{t}/claim",
        {"owner_id": "worker-a", "scheduler_epoch": -1, "ttl_seconds": 30},
        "scheduler_epoch",
    ),
    (
        "/claims",
        {"owner_id": "worker-a", "scheduler_epoch": 1, "ttl_seconds": 30, "node_ids": []},
        "node_ids",
    ),
    (
        "/tasks/{t}/renew",
        {
            "attempt_id": "not-a-uuid",
            "claim_generation": 1,
            "owner_id": "worker-a",
            "scheduler_epoch": 1,
            "cancel_generation": 0,
            "extend_seconds": 10,
        },
        "attempt_id",
    ),
    (
        "/tasks/{t}/release",
        {"claim_generation": 1, "owner_id": "worker-a", "scheduler_epoch": 1},
        "attempt_id",
    ),
    (
        "/tasks/{t}/results",
        {
            "attempt_id": "6b1f0b5e-6a7c-4c7e-9d7c-1c2b3a4d5e6f",
            "claim_generation": 1,
            "result": 1,
            "result_digest": "md5:abc",
        },
        "result_digest",
    ),
    (
        "/tasks/{t}/commit",
        {
            "attempt_id": "6b1f0b5e-6a7c-4c7e-9d7c-1c2b3a4d5e6f",
            "scheduler_epoch": 1,
            "claim_generation": 1,
            "observed_cancel_generation": 0,
            "input_digest": "sha256:zz",
            "result_digest": "sha256:" + "0" * 64,
        },
        "input_digest",
    ),
]


@pytest.mark.parametrize(("path", "body", "field"), BAD_BODIES)
def test_malformed_worker_bodies_are_400_with_field_errors_and_change_nothing(
    worker_a, ready_task, path, body, field
):
    before = _snapshot()

    response = worker_a.post(path.format(t=ready_task), body)

    assert response.status_code == 400
    assert response.json()["outcome"] == "INVALID" and field in response.json()["errors"]
    assert _snapshot() == before


def test_malformed_json_is_400_not_500(worker_a, ready_task):
    response = worker_a.client.post(
        f"/api/v1/tasks/{ready_task}/claim", "{not json", content_type="application/json"
    )

    assert response.status_code == 400 and response.json()["outcome"] == "INVALID"


def test_a_json_array_instead_of_an_object_is_400(worker_a, ready_task):
    response = worker_a.post(f"/tasks/{ready_task}/claim", [1, 2])

    assert response.status_code == 400


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": {}}, "node_id"),
        ({"node_id": "n"}, "input"),
        ({"node_id": "n", "input": 1, "replay_policy": "X"}, "replay_policy"),
        ({"node_id": "", "input": 1}, "node_id"),
        ({"task_id": "run-7/parse", "node_id": "n", "input": 1}, "task_id"),
        ({"task_id": 7, "node_id": "n", "input": 1}, "task_id"),
        ({"node_id": "n", "input": 1, "depends_on": "t-1"}, "depends_on"),
    ],
)
def test_malformed_task_bodies_are_400(operator, default_namespace, body, field):
    response = operator.post("/tasks", body)

    assert response.status_code == 400 and field in response.json()["errors"]
    assert not Task.objects.exists()


def test_the_body_is_judged_before_the_task_is_looked_up(worker_a):
    bad = worker_a.post("/tasks/missing/claim", {"owner_id": "worker-a"})
    good = worker_a.claim("missing")

    assert bad.status_code == 400
    assert good.status_code == 404 and good.json()["outcome"] == "NOT_FOUND"


@pytest.mark.parametrize(
    "path",
    ["/tasks/{t}/claim", "/tasks/{t}/renew", "/tasks/{t}/release", "/tasks/{t}/results", "/tasks/{t}/commit"],
)
def test_unknown_tasks_are_404_for_workers(worker_a, ready_task, path):
    claim = worker_a.claim(ready_task).json()
    body = {
        "/tasks/{t}/claim": {"owner_id": "worker-a", "scheduler_epoch": 1, "ttl_seconds": 30},
        "/tasks/{t}/renew": {
            "attempt_id": claim["attempt_id"],
            "claim_generation": 1,
            "owner_id": "worker-a",
            "scheduler_epoch": 1,
            "cancel_generation": 0,
            "extend_seconds": 10,
        },
        "/tasks/{t}/release": {
            "attempt_id": claim["attempt_id"],
            "claim_generation": 1,
            "owner_id": "worker-a",
            "scheduler_epoch": 1,
        },
        "/tasks/{t}/results": {
            "attempt_id": claim["attempt_id"],
            "claim_generation": 1,
            "result": 1,
            "result_digest": "sha256:6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b",
        },
        "/tasks/{t}/commit": {
            "attempt_id": claim["attempt_id"],
            "scheduler_epoch": 1,
            "claim_generation": 1,
            "observed_cancel_generation": 0,
            "input_digest": claim["input_digest"],
            "result_digest": "sha256:" + "0" * 64,
        },
    }[path]

    response = worker_a.post(path.format(t="no-such-task"), body)

    assert response.status_code == 404


@pytest.mark.parametrize("path", ["/tasks/{t}", "/tasks/{t}/events"])
def test_unknown_tasks_are_404_for_reads(worker_a, path):
    assert worker_a.get(path.format(t="nope")).status_code == 404


@pytest.mark.parametrize("path", ["/tasks/{t}/cancel", "/tasks/{t}/input", "/tasks/{t}/requeue"])
def test_unknown_tasks_are_404_for_operators(operator, path):
    body = {"/tasks/{t}/cancel": {"reason": "x"}, "/tasks/{t}/input": {"input": 1}, "/tasks/{t}/requeue": {}}[
        path
    ]
    assert operator.post(path.format(t="nope"), body).status_code == 404


def test_unknown_namespaces_are_404(worker_a, oncall):
    assert worker_a.get("/namespaces/nowhere").status_code == 404
    assert oncall.post("/namespaces/nowhere/fence", {"reason": "x"}).status_code == 404
    assert oncall.post("/namespaces/nowhere/resume", {}).status_code == 404


def test_claim_next_in_an_unknown_namespace_is_a_field_error(worker_a, default_namespace):
    response = worker_a.claim_next(namespace="nowhere")

    assert response.status_code == 400 and "namespace" in response.json()["errors"]


def test_an_unknown_attempt_is_fenced_by_attempt(worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()

    response = worker_a.renew(claim, attempt_id="6b1f0b5e-6a7c-4c7e-9d7c-1c2b3a4d5e6f")

    assert (response.json()["outcome"], response.json()["reason"]) == ("FENCED", "ATTEMPT")


def test_unknown_urls_answer_json_404(worker_a):
    response = worker_a.client.get("/api/v1/nothing-here")

    assert response.status_code == 404 and response.json()["outcome"] == "NOT_FOUND"


def test_wrong_methods_are_405(worker_a, ready_task):
    assert worker_a.client.get(f"/api/v1/tasks/{ready_task}/claim").status_code == 405


def test_the_openapi_schema_and_docs_need_no_token(anonymous):
    schema = anonymous.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    docs = anonymous.get("/api/v1/docs/")

    assert schema.status_code == 200 and docs.status_code == 200
    paths = schema.json()["paths"]
    for path in [
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}/claim",
        "/api/v1/claims",
        "/api/v1/tasks/{task_id}/commit",
        "/api/v1/namespaces/{ns}/fence",
    ]:
        assert path in paths
    assert "bearer" in schema.json()["components"]["securitySchemes"]


@pytest.mark.parametrize(
    "body",
    [
        {"node_id": "a\x00b", "input": 1},
        {"node_id": "n", "input": {"k": "v\x00"}},
        {"node_id": "n", "input": {"k\x00": 1}},
    ],
)
def test_nul_characters_are_400_not_a_database_error(operator, default_namespace, body):
    response = operator.post("/tasks", body)

    assert response.status_code == 400
    assert not Task.objects.exists()


def test_null_values_are_400_with_a_field_error_not_a_database_error(
    operator, worker_a, ready_task, effect_target
):
    """Found by the long fuzz run (FUZZ_EXAMPLES=300): {"input": null} reached the NOT NULL column and was a 500."""
    created = operator.post("/tasks", {"node_id": "n", "input": None})
    revised = operator.post(f"/tasks/{ready_task}/input", {"input": None})
    claim = worker_a.claim(ready_task).json()
    staged = worker_a.stage(claim, None)
    key = worker_a.prepare(claim, "notify", {"x": 1}).json()["effect_id"]
    dispatched = worker_a.dispatch(claim, key, None, effect_target.url + "/send")

    for response, field in (
        (created, "input"),
        (revised, "input"),
        (staged, "result"),
        (dispatched, "payload"),
    ):
        assert response.status_code == 400, response.content
        assert "null" in response.json()["errors"][field][0]
    assert Task.objects.count() == 1 and Task.objects.get().input == {"source": "grammar.y"}  # nor revised
    assert not StagedResult.objects.exists() and not DispatchIntent.objects.exists()


@pytest.mark.parametrize(
    "path", ["/api/v1/tasks/a%00b", "/api/v1/tasks/a%00b/events", "/api/v1/namespaces/x%00"]
)
def test_ids_in_paths_that_no_task_could_have_are_404(worker_a, path):
    assert worker_a.client.get(path).status_code == 404


def test_a_body_nested_too_deeply_is_400(worker_a, ready_task):
    body = "[" * 100_000 + "]" * 100_000
    response = worker_a.client.post(
        f"/api/v1/tasks/{ready_task}/claim", body, content_type="application/json"
    )

    assert response.status_code == 400


def test_a_body_over_the_size_limit_is_400(operator, default_namespace, settings):
    response = operator.client.post(
        "/api/v1/tasks",
        '{"node_id": "n", "input": "' + "x" * 3_000_000 + '"}',
        content_type="application/json",
    )

    assert response.status_code == 400
    assert not Task.objects.exists()


def test_the_console_asks_for_a_login_first(anonymous):
    response = anonymous.get("/")

    assert response.status_code == 302 and response["Location"].startswith("/login")
    assert anonymous.get("/login").status_code == 200


def test_an_unknown_task_is_404_even_when_the_owner_id_is_not_the_callers(worker_a):
    as_other = worker_a.post(
        "/tasks/no-such-task/claim", {"owner_id": "worker-b", "scheduler_epoch": 1, "ttl_seconds": 30}
    )
    legacy = worker_a.client.post(
        "/api/legacy/tasks/no-such-task/claim", {"owner_id": "worker-b", "ttl_seconds": 30}, format="json"
    )

    assert as_other.status_code == 404 and legacy.status_code == 404  # 404 comes before the owner's 403
