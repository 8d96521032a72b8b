"""Reviewers' work on shadow mismatches: marking them, and rules that explain a reason as it arrives."""

from __future__ import annotations

from django.db import transaction

from claims import clock
from claims import services as core
from claims.errors import InvalidTransition, NotFound
from claims.models import Namespace, Principal
from claims.validation import one_of, real_text

from ..models import ExplainRule, Mismatch, MismatchStatus


def mismatch_review(*, principal: Principal, mismatch_id: int, status: str, note: str) -> Mismatch:
    """A reviewer marks a mismatch EXPLAINED (with a note) or BUG; a BUG is re-marked EXPLAINED once fixed."""
    one_of(status, [MismatchStatus.EXPLAINED, MismatchStatus.BUG], field="status")
    note = (note or "").strip()
    if status == MismatchStatus.EXPLAINED:
        note = real_text(
            note, field="note", why="An explanation needs a note: what makes the mismatch expected."
        )
    with transaction.atomic(durable=True):
        mismatch = Mismatch.objects.select_for_update().filter(pk=mismatch_id).first()
        if mismatch is None:
            raise NotFound("no such mismatch")
        if mismatch.status == status:
            raise InvalidTransition(
                f"mismatch {mismatch_id} is already {status} (by {mismatch.reviewed_by or 'a rule'}: "
                f"{mismatch.note or 'no note'}); nothing changed",
                current={"status": mismatch.status, "reviewed_by": mismatch.reviewed_by},
            )
        mismatch.status, mismatch.note, mismatch.reviewed_by = status, note, principal.name
        mismatch.save(update_fields=["status", "note", "reviewed_by"])
        core.audit(
            principal=principal,
            action="mismatch_review",
            at=clock.now(),
            namespace=mismatch.namespace,
            target=str(mismatch_id),
            reason=note,
            detail={"status": status, "reason": mismatch.reason},
        )
    return mismatch


def explain_rule_create(*, principal: Principal, namespace: str, reason: str, note: str) -> ExplainRule:
    """Mark future mismatches of ``reason`` EXPLAINED as they arrive (recorded as explained by this rule)."""
    if not Namespace.objects.filter(name=namespace).exists():
        raise NotFound(f"no such namespace: {namespace}")
    with transaction.atomic(durable=True):
        now = clock.now()
        rule = ExplainRule.objects.create(
            namespace=namespace, reason=reason, note=note, created_by=principal.name, created_at=now
        )
        core.audit(
            principal=principal,
            action="explain_rule_create",
            at=now,
            namespace=namespace,
            target=reason,
            reason=note,
        )
    return rule
