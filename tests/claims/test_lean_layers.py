"""The worker path's Python, made leaner without changing a byte of what a client sees: the string fields' checks
(DRF's surrogate check by one regex search, its NUL check left to the field's own) and the late-rendering DRF
response rendered in the executor's thread (claims/waiting.py ``_rendered``)."""

from __future__ import annotations

from datetime import UTC

import pytest
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from claims import serializers as s
from claims.waiting import _rendered
from tests.support.races import index_names


@pytest.mark.parametrize("field", [s.identifier(), s.StrictCharField(max_length=2000, min_length=1)])
@pytest.mark.parametrize(
    ("text", "code_point"), [("a\ud800b", "D800"), ("\udfff", "DFFF"), ("ok-\udbff", "DBFF")]
)
def test_a_lone_surrogate_gets_drfs_own_message_and_code(field, text, code_point):
    with pytest.raises(serializers.ValidationError) as refused:
        field.run_validation(text)

    (detail,) = refused.value.detail
    assert str(detail) == f"Surrogate characters are not allowed: U+{code_point}."
    assert detail.code == "surrogate_characters_not_allowed"


@pytest.mark.parametrize("field", [s.task_identifier(), s.DigestField()])
def test_a_lone_surrogate_in_a_patterned_field_is_refused_too(field):
    with pytest.raises(serializers.ValidationError):
        field.run_validation("a\ud800b")


def test_nul_is_refused_by_the_fields_own_check_and_plain_text_passes():
    field = s.identifier()

    with pytest.raises(serializers.ValidationError) as refused:
        field.run_validation("a\x00b")

    assert refused.value.detail[0].code == "nul"
    assert field.run_validation("worker-7 ✓ ünïcode") == "worker-7 ✓ ünïcode"


class _Conflict(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def post(self, request):
        response = Response({"outcome": "STALE_GENERATION", "task_id": "t"}, status=409)
        response["X-Extra"] = "kept"
        response.claim_wait = "the wait"  # what claims.waiting reads after the view
        return response


def test_a_drf_response_is_handed_on_rendered_with_status_headers_body_and_wait():
    view = _Conflict.as_view()
    late = view(APIRequestFactory().post("/x", {}, format="json"))
    expected_headers = dict(late.render().headers)
    late = view(APIRequestFactory().post("/x", {}, format="json"))

    plain = _rendered(late)

    assert not callable(getattr(plain, "render", None))  # Django's handler has nothing left to render
    assert plain.status_code == 409
    assert plain.content == b'{"outcome":"STALE_GENERATION","task_id":"t"}'
    assert dict(plain.headers) == expected_headers
    assert plain["Content-Type"] == "application/json"
    assert plain.claim_wait == "the wait"


def test_prep_hands_native_values_on_as_the_field_itself_would(db):
    import uuid
    import warnings
    from datetime import UTC, datetime

    from django.db import connection

    from claims.models import Attempt
    from claims.services import _sql

    attempt_id, now = uuid.uuid4(), datetime.now(UTC)
    for attname, value in [
        ("attempt_id", attempt_id),
        ("started_at", now),
        ("owner_id", "w"),
        ("pool", "v1"),
    ]:
        field = Attempt._meta.get_field(attname)
        assert _sql.prep(Attempt, attname, value) == field.get_db_prep_save(value, connection)
    assert _sql.prep(Attempt, "attempt_id", str(attempt_id)) == Attempt._meta.get_field(
        "attempt_id"
    ).get_db_prep_save(attempt_id, connection)  # a UUID sent as text is converted, on both databases
    with warnings.catch_warnings(record=True) as caught:  # a naive datetime still meets Django's own check
        warnings.simplefilter("always")
        _sql.prep(Attempt, "started_at", datetime(2026, 1, 1))
    assert any("naive datetime" in str(w.message) for w in caught)


def test_load_gives_each_row_as_the_orm_loads_it(operator, worker_a):
    """``_sql.load`` (rows by position into Model.from_db, timestamps by psycopg's C loader on PostgreSQL) against
    the ORM's own load of the same row: every field equal, datetimes aware in UTC, and a column that is not a
    field kept as an attribute."""

    from claims.models import Task
    from claims.services import _sql

    claim = (
        worker_a.claim_next()
        if operator.create(node_id="n", input={"k": [1, "x"]}).status_code == 201
        else None
    )
    assert claim is not None and claim.status_code == 200
    task_id = claim.json()["task_id"]

    (loaded,) = _sql.load(Task, "SELECT t.*, 7 AS extra FROM claims_task t WHERE t.task_id = %s", [task_id])

    orm = Task.objects.get(pk=task_id)
    for field in Task._meta.concrete_fields:
        assert getattr(loaded, field.attname) == getattr(orm, field.attname), field.attname
    for name in ("created_at", "updated_at", "lease_expires_at"):
        assert getattr(loaded, name).utcoffset().total_seconds() == 0
        assert getattr(loaded, name).tzinfo in (UTC, getattr(orm, name).tzinfo)
    assert loaded.extra == 7 and loaded.input == {"k": [1, "x"]} and loaded._state.adding is False


HOT_TABLE_INDEXES = {
    "claims_attempt": {"attempt_generation_once", "attempt_ns_live", "claims_attempt_pkey"},
    "claims_stagedresult": {
        "claims_stagedresult_commit_id_key",
        "claims_stagedresult_pkey",
        "one_canonical_commit_per_task",
        "staged_once_per_attempt_digest",
        "staged_task",
    },
    "claims_task": {
        "claims_task_pkey",
        "claims_task_result_commit_id_key",
        "task_claimed_epoch",  # claim-v1.md §10: a claim asks whether a fenced claim outranks a READY task
        "task_claimed_lease",
        "task_created",
        "task_ns_created",
        "task_open_created",
        "task_open_ns_created",
        "task_ready_order",
        "task_ready_key",  # claims.queues: each key's backlog, a bounded range a key (an entry per task made READY)
    },
    "claims_taskevent": {"claims_taskevent_pkey", "event_at", "event_ns_point_at", "event_task_timeline"},
}


@pytest.mark.postgres
def test_the_hot_tables_carry_only_the_indexes_the_product_names(db):
    """Each index on these tables is an entry every claim, commit and event writes (a task update is non-HOT): a
    foreign key's default index, or PostgreSQL's LIKE twin of a text key, coming back unasked fails here."""
    assert index_names(HOT_TABLE_INDEXES) == HOT_TABLE_INDEXES
