"""Operator pages for the claim.v1 records: tasks (search, detail) and the effects backlog with its actions."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from . import clock, selectors, services
from .errors import ClaimError, Invalid
from .models import Effect, EffectState, Task, TaskState
from .services.principals import ui_role
from .ui import acting, labelled, refused, role_required, task_notes


def _ctx(request: HttpRequest, **extra) -> dict:
    return {"ui_role": ui_role(request.user), **extra}


@role_required("viewer")
def tasks(request: HttpRequest) -> HttpResponse:
    q, state, ns = request.GET.get("q", "").strip(), request.GET.get("state", ""), request.GET.get("ns", "")
    # Newest first, read backwards along an index (task_created, task_open_created, task_ns_…): a page of 200 costs
    # the same whatever the history. The search (q) is a substring match and scans what it must.
    rows = Task.objects.select_related("namespace").order_by("-created_at", "-task_id")
    if q:
        rows = rows.filter(Q(task_id__icontains=q) | Q(node_id__icontains=q) | Q(owner_id__icontains=q))
    if state:
        rows = rows.filter(state=state)
    if ns:
        rows = rows.filter(namespace__name=ns)
    now = clock.now()
    listed = [
        {
            "task": task,
            "lease_left": (task.lease_expires_at - now).total_seconds() if task.lease_expires_at else None,
        }
        for task in rows[:200]
    ]
    return render(
        request,
        "claims/tasks.html",
        _ctx(request, rows=listed, q=q, state=state, ns=ns, states=TaskState.values),
    )


def _mismatches_url(task: Task) -> str | None:
    """The rollout's mismatch list for this task's namespace, when the rollout is installed (the core knows only
    that such a page may exist, by its URL name)."""
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse("console:mismatches", args=[task.namespace.name]) + f"?task={task.task_id}"
    except NoReverseMatch:
        return None


@role_required("viewer")
def task_detail(request: HttpRequest, task_id: str) -> HttpResponse:
    task = get_object_or_404(Task.objects.select_related("namespace"), pk=task_id)
    now = clock.now()
    return render(
        request,
        "claims/task.html",
        _ctx(
            request,
            task=task,
            lease_left=(task.lease_expires_at - now).total_seconds() if task.lease_expires_at else None,
            fenced=selectors.attempt_fenced(task),
            events=task.events.order_by("id"),
            history=selectors.task_lanes(task=task, now=now),
            notes=task_notes(task),
            taken_at=now,
            mismatches_url=_mismatches_url(task),
            attempts=task.attempts.order_by("claim_generation"),
            staged=task.staged_results.order_by("staged_at"),
            effects=labelled(task.effects.order_by("created_at")),
        ),
    )


@require_POST
@role_required("operator")
def task_priority(request: HttpRequest, task_id: str) -> HttpResponse:
    """claim-v1.md §10: the task's priority for its next grant, with a reason (audited); a holder keeps its claim."""
    raw = request.POST.get("priority", "").strip()
    priority: Any = int(raw) if raw.isdigit() and len(raw) < 3 else raw  # the service names a bad one
    try:
        task = services.task_set_priority(
            principal=acting(request),
            task_id=task_id,
            priority=priority,
            reason=request.POST.get("reason", ""),
        )
    except ClaimError as exc:
        return refused(
            request,
            exc,
            form="priority",
            again=lambda: task_detail(request, task_id),
            back=lambda: redirect("console:task", task_id),
        )
    messages.success(request, f"Priority {task.priority}: {task_id} takes its new place at its next grant.")
    return redirect("console:task", task_id)


@role_required("viewer")
def effects(request: HttpRequest) -> HttpResponse:
    """The backlog: UNKNOWN effects to reconcile and NON_REPLAYABLE ones awaiting approval — of one namespace with
    ``?ns=`` (a rollback's blockers link here so)."""
    return _effects_page(request, request.GET.get("ns", "").strip())


def _effects_page(request: HttpRequest, ns: str) -> HttpResponse:
    unknown = Effect.objects.filter(state=EffectState.UNKNOWN).select_related("task").order_by("updated_at")
    awaiting = (
        Effect.objects.filter(non_replayable=True, approved_at__isnull=True)
        .exclude(state=EffectState.COMMITTED)
        .select_related("task")
        .order_by("created_at")
    )
    if ns:
        unknown, awaiting = unknown.filter(namespace__name=ns), awaiting.filter(namespace__name=ns)
    return render(
        request,
        "claims/effects.html",
        _ctx(
            request,
            unknown=labelled(unknown),
            awaiting=labelled(awaiting),
            ns=ns,
            namespaces=list(selectors.namespace_list().values_list("name", flat=True)),
            taken_at=clock.now(),
        ),
    )


@require_POST
@role_required("operator")
def effect_reconcile(request: HttpRequest, effect_id: str) -> HttpResponse:
    observed = request.POST.get("observed", "")

    def back() -> HttpResponse:
        if request.POST.get("back_to_task"):  # reconciled from the task's own page: back to the effect's task
            task_id = Effect.objects.filter(pk=effect_id).values_list("task_id", flat=True).first()
            if task_id is not None:
                return redirect("console:task", task_id=task_id)
        return _back_to_effects(request)

    def again() -> HttpResponse:
        task_id = Effect.objects.filter(pk=effect_id).values_list("task_id", flat=True).first()
        if request.POST.get("back_to_task") and task_id is not None:
            return task_detail(request, task_id)
        return _effects_page(request, request.POST.get("ns", "").strip())

    try:
        if observed == "NOT_OCCURRED" and request.POST.get("confirm") != "on":
            # The console's confirmation; the reason is the service's rule, the API's too.
            raise Invalid({"confirm": ["Tick that you checked the target and it did not happen."]})
        effect = services.effect_reconcile(
            principal=acting(request),
            effect_id=effect_id,
            observed=observed,
            external_ref=request.POST.get("external_ref") or None,
            reason=request.POST.get("reason", ""),
        )
    except ClaimError as exc:
        return refused(request, exc, form=f"reconcile-{effect_id[:16]}", again=again, back=back)
    if effect.state == "PREPARED":
        messages.warning(
            request,
            f"Recorded: effect {effect_id[:12]}… did not occur. It is PREPARED again and will be sent again under "
            "the same key.",
        )
    else:
        messages.success(request, f"Recorded: effect {effect_id[:12]}… occurred; it is now {effect.state}.")
    return back()


def _back_to_effects(request: HttpRequest) -> HttpResponse:
    """The backlog as the operator had it: of the namespace it was filtered by."""
    ns = request.POST.get("ns", "")
    url = reverse("console:effects")
    return redirect(f"{url}?{urlencode({'ns': ns})}" if ns else url)


@require_POST
@role_required("operator")
def effect_approve(request: HttpRequest, effect_id: str) -> HttpResponse:
    try:
        services.effect_approve(
            principal=acting(request), effect_id=effect_id, note=request.POST.get("note", "")
        )
    except ClaimError as exc:
        return refused(
            request,
            exc,
            form=f"approve-{effect_id[:16]}",
            again=lambda: _effects_page(request, request.POST.get("ns", "").strip()),
            back=lambda: _back_to_effects(request),
        )
    messages.success(request, f"Approved: effect {effect_id[:12]}… may run once.")
    return _back_to_effects(request)


@role_required("operator")
def audit(request: HttpRequest) -> HttpResponse:
    """Every audited action — fences from the console, the API, the CLI, a rollback or a job; resumes, overrides,
    waivers, reviews, reconciles, approvals — with principal, reason and time; filtered by namespace, action and
    principal; newest first, a page at a time (``before``)."""
    filters = {key: request.GET.get(key, "").strip() for key in ("namespace", "action", "principal")}
    with_work = request.GET.get("work") == "1"
    raw_before = request.GET.get("before", "")
    before = int(raw_before) if raw_before.isdigit() and len(raw_before) < 19 else None  # a bigint or nothing
    entries, older = selectors.audit_entries(**filters, before=before, with_work=with_work)
    return render(
        request,
        "claims/audit.html",
        _ctx(
            request,
            entries=entries,
            older=older,
            filters=filters,
            with_work=with_work,
            actions=selectors.audit_actions(),
            taken_at=clock.now(),
        ),
    )
