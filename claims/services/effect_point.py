"""The effect acceptance point (claim-v1.md §6) every effect call stands at — prepare, dispatch, outcome,
reconcile, approve: the locks it holds, in the documented order (the task row with its namespace, then the effect
row, then the clock), and the authority it requires of the caller once they are held."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..digest import effect_id as make_effect_id
from ..errors import NotFound
from ..models import AcceptancePoint, Effect, Principal
from ._base import locked_rows
from .authority import Acceptance, Named, acceptance_point


@contextmanager
def at_effect_point(
    principal: Principal,
    task_id: str,
    named: Named,
    *,
    effect_id: str | None = None,
    effect_slot: str = "",
) -> Iterator[tuple[Acceptance, Effect | None]]:
    """One effect call: a request at the `effect` acceptance point (``authority.acceptance_point``), holding, in
    the documented order, the task row with its namespace and then the effect row (named, or the slot's) — and
    the clock read after both. The caller authorises (``authorise``) once every lock it needs is held, so
    authority is judged on what the locks keep still."""
    with acceptance_point(AcceptancePoint.EFFECT, principal=principal, task_id=task_id, named=named) as at:
        eid = effect_id or make_effect_id(at.task.task_id, at.task.node_id, effect_slot)
        rows, db_now = locked_rows(Effect, "effect_id = %s", [eid], order="effect_id", lock="FOR UPDATE")
        at.after(db_now)
        yield at, rows[0] if rows else None


@contextmanager
def at_named_effect(
    principal: Principal, effect_id: str, named: Named
) -> Iterator[tuple[Acceptance, Effect]]:
    """An effect call on an effect named by its id (dispatch, outcome, reconcile): its task found, then
    ``at_effect_point``'s locks; 404 when there is no such effect."""
    with at_effect_point(principal, task_of(effect_id), named, effect_id=effect_id) as (at, effect):
        if effect is None:
            raise NotFound("no such effect")
        yield at, effect


def authorise(at: Acceptance) -> None:
    """Authority for an effect call (§6): the attempt named is the task's current attempt, owned by the caller,
    not fenced by the epoch rule, its lease not expired, the task not cancelled. 403 before 409."""
    at.require_owner()
    at.resolve_attempt()
    at.require_not_cancelled()
    at.require_current_attempt()
    at.require_live_lease()


def lock_effect(effect_id: str) -> Effect:
    effect = Effect.objects.select_for_update().filter(pk=effect_id).first()
    if effect is None:
        raise NotFound("no such effect")
    return effect


def task_of(effect_id: str) -> str:
    task_id = Effect.objects.filter(pk=effect_id).values_list("task_id", flat=True).first()
    if task_id is None:
        raise NotFound("no such effect")
    return task_id
