"""The security pass: hashed tokens, owner binding, roles, CSRF on the console, nothing secret in records or logs,
and a rate limit per principal."""

from __future__ import annotations

import inspect
import logging

import pytest

from claims import auth
from claims.models import AuditEntry, EffectEvent, Namespace, TaskEvent, Token

SECRET = "SECRET-PAYLOAD-7f3a"


def test_tokens_are_hashed_and_compared_in_constant_time(worker_a):
    stored = Token.objects.get(principal__name="worker-a")
    assert worker_a.token not in (stored.key_hash, stored.prefix) and len(stored.key_hash) == 64
    assert "hmac.compare_digest" in inspect.getsource(
        auth.principal_for_token
    )  # the API's and the MCP gateway's lookup
    assert "cp_" in stored.prefix and len(stored.prefix) < len(worker_a.token) // 3


def test_a_worker_can_neither_act_as_another_nor_reach_operator_endpoints(worker_a, worker_b, ready_task):
    claim = worker_b.claim(ready_task).json()

    as_other = worker_a.post(
        f"/tasks/{ready_task}/claim", {"owner_id": "worker-b", "scheduler_epoch": 1, "ttl_seconds": 30}
    )
    on_other_attempt = worker_a.renew(claim)
    operator_only = [
        worker_a.post(f"/tasks/{ready_task}/cancel", {"reason": "x"}),
        worker_a.post("/namespaces/default/fence", {"reason": "x"}),
        worker_a.post("/resources", {"resource_key": "k"}),
    ]

    assert as_other.status_code == 403 and on_other_attempt.status_code == 403
    assert [r.status_code for r in operator_only] == [403, 403, 403]
    assert Namespace.objects.get(name="default").scheduler_epoch == 1


def test_no_secret_or_payload_reaches_the_timeline_the_audit_log_or_the_logs(
    worker_a, operator, caplog, effect_target, django_capture_on_commit_callbacks
):
    caplog.set_level(logging.DEBUG)
    task_id = operator.create(input={"api_key": SECRET}).json()["task_id"]
    claim = worker_a.claim(task_id).json()
    key = worker_a.prepare(claim, "send", {"body": SECRET}).json()["effect_id"]
    with django_capture_on_commit_callbacks(execute=True):
        worker_a.dispatch(claim, key, {"body": SECRET}, effect_target.url)
    worker_a.finish(claim, {"echo": SECRET})
    operator.post(f"/tasks/{task_id}/input", {"input": {"other": 1}})

    records = [str(e.detail) for e in TaskEvent.objects.all()] + [
        str(e.detail) for e in EffectEvent.objects.all()
    ]
    records += [f"{a.detail} {a.reason}" for a in AuditEntry.objects.all()]
    assert all(SECRET not in record for record in records)
    assert SECRET not in caplog.text and worker_a.token not in caplog.text
    assert effect_target.count(key) == 1  # the payload did travel where it was meant to


def test_one_client_is_rate_limited(worker_a, worker_b, ready_task, settings):
    from django.core.cache import cache

    cache.clear()
    settings.API_RATE_LIMIT = "5/hour"  # a fixed window: an hour is not crossed mid-test

    statuses = [worker_a.get(f"/tasks/{ready_task}").status_code for _ in range(7)]
    other = worker_b.get(f"/tasks/{ready_task}")

    assert statuses[:5] == [200] * 5 and statuses[5:] == [429, 429]
    assert other.status_code == 200  # the budget is per principal
    cache.clear()


@pytest.mark.parametrize("size", [1001])
def test_bounded_work_per_request(operator, default_namespace, size):
    too_many = operator.create(depends_on=[f"t-{i}" for i in range(size)])
    too_big_page = operator.get("/tasks", page_size=100000)

    assert too_many.status_code == 400
    assert too_big_page.status_code == 200 and too_big_page.json()["count"] == 0


def test_a_revoked_token_is_refused_at_once_here_and_within_the_cache_bound_everywhere(
    worker_a, settings, monkeypatch, django_capture_on_commit_callbacks
):
    from claims.services import token_issue, token_revoke

    settings.TOKEN_CACHE_SECONDS = 5
    now = [1000.0]
    monkeypatch.setattr(auth.tokens, "clock", lambda: now[0])
    assert worker_a.get("/tasks").status_code == 200  # looked up, then remembered

    # revoked in this process: forgotten here as the revocation commits
    with django_capture_on_commit_callbacks(execute=True):
        assert token_revoke(token_id=Token.objects.get(principal__name="worker-a").pk)
    assert worker_a.get("/tasks").status_code == 401

    # revoked by another process (the row changed, this process not told): refused once the bound has passed
    from rest_framework.test import APIClient

    other = token_issue(name="worker-a", role="worker", pool="v1").token
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {other}")
    assert api.get("/api/v1/tasks").status_code == 200
    Token.objects.filter(prefix=other[:10]).update(revoked_at="2026-01-01T00:00:00Z")
    now[0] += 4.9
    assert api.get("/api/v1/tasks").status_code == 200  # still within 5 s
    now[0] += 0.2
    assert api.get("/api/v1/tasks").status_code == 401


def test_bearer_api_calls_skip_session_csrf_and_message_work_the_console_keeps_it(
    worker_a, client, monkeypatch
):
    from django.contrib.messages.middleware import MessageMiddleware
    from django.contrib.sessions.middleware import SessionMiddleware
    from django.middleware.csrf import CsrfViewMiddleware

    calls: list[str] = []
    for cls, method in [
        (SessionMiddleware, "process_request"),
        (CsrfViewMiddleware, "process_view"),
        (MessageMiddleware, "process_request"),
    ]:
        original = getattr(cls, method)

        def counted(self, *args, _original=original, _name=f"{cls.__name__}.{method}"):
            calls.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(cls, method, counted)

    assert worker_a.get("/tasks").status_code == 200
    assert worker_a.claim_next().status_code in (200, 204)
    assert calls == []
    assert client.get("/login").status_code == 200
    assert set(calls) == {
        "SessionMiddleware.process_request",
        "CsrfViewMiddleware.process_view",
        "MessageMiddleware.process_request",
    }
