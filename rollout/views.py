"""The rollout's pages of the console (server-rendered): a namespace's rollout page, advance, rollback, waivers and
mismatches. The on-call pages — overview, fence, resume, pools, glance — are the on-call app's (oncall/views.py).
Every action checks the role and goes through a service, which writes the audit log with the principal."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from claims import clock, interleave, queues
from claims.errors import ClaimError, Invalid, InvalidTransition
from claims.models import (
    Namespace,
)
from claims.selectors import one_snapshot
from claims.services.principals import ui_role
from claims.ui import LIVE_REFRESH_SECONDS, acting, refused, report, role_required
from oncall import selectors as oncall_selectors

from . import console, selectors
from .models import (
    DrainSnapshot,
    GateEvaluation,
    Mismatch,
    MismatchReason,
    MismatchStatus,
    Rollback,
    StageChange,
)
from .services import stages
from .services.reviews import explain_rule_create, mismatch_review


def _ctx(request: HttpRequest, **extra) -> dict:
    return {"ui_role": ui_role(request.user), **extra}


def _linked(checklist: list[dict], ns: str) -> list[dict]:
    """Each checklist row's ``link`` (a console page and its query) as an address."""
    for row in checklist:
        if row["link"]:
            name, query = row["link"]
            url = reverse(name, args=[ns] if name == "console:mismatches" else [])
            row["href"] = f"{url}?{query}" if query else url
    return checklist


def _rollout_context(request: HttpRequest, ns: Namespace) -> dict:
    stage = selectors.stage_of(ns)
    interleave.reach("rollout_page.stage_read")  # a stage move committing here must not show half-applied
    gate = selectors.last_gate(ns, stage)
    order = selectors.ORDER
    here = order.index(stage)
    steps = [{"stage": stage, "done": i < here, "current": i == here} for i, stage in enumerate(order)]
    now = clock.now()
    drains = {
        label: DrainSnapshot.objects.filter(namespace=ns.name, pool=pool).order_by("-taken_at").first()
        for label, pool in (("legacy pool", "legacy"), ("whole namespace", ""))
    }
    stale_drains = {label for label, snap in drains.items() if selectors.snapshot_is_stale(snap, now)}
    coverage = selectors.coverage(ns)
    return {
        "taken_at": now,
        "refresh_seconds": LIVE_REFRESH_SECONDS,
        "stale_drains": stale_drains,
        "drain_chart": console.drain_progress(ns.name),
        "ns": ns,
        "steps": steps,
        "gate": gate,
        "stage": stage,
        "gate_age": oncall_selectors.age_seconds(gate.at) if gate else None,
        "next_stage": selectors.next_stage(stage),
        "earlier": order[:here],
        "coverage": coverage,
        "coverage_chart": console.coverage_chart(coverage),
        "drains": drains,
        "queue": queues.queue(ns, now),
        "rollback": (rollback := Rollback.objects.filter(namespace=ns.name).order_by("-started_at").first()),
        "written_over": selectors.write_back_differences(ns.name, rollback.pk) if rollback else [],
        "legacy_import": selectors.legacy_import_of(ns.name),
        "observers": selectors.observers_shown(),
        "open_rollback": (open_rollback := selectors.open_rollback(ns.name)),
        "rollback_key": f"{stage}|{open_rollback.pk}|{open_rollback.step}" if open_rollback else stage,
        "chosen_back_to": request.GET.get("to_stage") or request.POST.get("to_stage", ""),
        "incident": oncall_selectors.incident(ns, now),
        "checklist": _linked(console.gate_checklist(ns, gate, coverage), ns.name),
        "fences": oncall_selectors.fence_history(ns.name),
        "changes": StageChange.objects.filter(namespace=ns.name).order_by("-at")[:10],
        "last_gates": _last_gates(ns, stage),
    }


def _last_gates(ns: Namespace, stage: str) -> list[dict]:
    """Every move's last recorded evaluation; only the one out of the current stage, recorded since the stage
    began, is the gate now — the others are history (after a rollback the old forward gate read HOLDS)."""
    order, started = selectors.ORDER, selectors.stage_started_at(ns)
    rows = []
    for a, b in zip(order, order[1:], strict=False):
        move = f"{a} → {b}"
        gate = GateEvaluation.objects.filter(namespace=ns.name, move=move).order_by("-at").first()
        rows.append(
            {"move": move, "g": gate, "current": gate is not None and a == stage and gate.at >= started}
        )
    return rows


@role_required("viewer")
def rollout_page(request: HttpRequest, ns: str) -> HttpResponse:
    """The namespace's rollout page; ``?part=live`` (htmx polls it) renders only the live region — stage, epoch,
    pause, gate, drain, rollback, fences — so the forms below keep what an operator is typing."""
    part = {"live": "rollout/_live.html", "rollback": "rollout/_rollback.html"}.get(
        request.GET.get("part", "")
    )
    with one_snapshot():  # every figure as of one moment: never the old stage beside a finished rollback
        namespace = get_object_or_404(Namespace, name=ns)
        context = _ctx(request, **_rollout_context(request, namespace))
        if part == "rollout/_rollback.html" and request.GET.get("shown") == context["rollback_key"]:
            # Unchanged: htmx keeps the form as it is (an open list stays open).
            return HttpResponse(status=204)
        return render(request, part or "rollout/rollout.html", context)


def _confirmed(request: HttpRequest, flag: str, unticked: str) -> bool:
    """Whether the form asks for ``flag`` (an override, a force); asked for, its ``confirm_<flag>`` box must be
    ticked — the console's confirmation (Invalid otherwise, with ``unticked`` as the field's error)."""
    asked = bool(request.POST.get(flag))
    if asked and request.POST.get(f"confirm_{flag}") != "on":
        raise Invalid({f"confirm_{flag}": [unticked]})
    return asked


def _move(request: HttpRequest) -> dict[str, str]:
    return {"to_stage": request.POST.get("to_stage", ""), "reason": request.POST.get("reason", "")}


@role_required("operator")
def advance(request: HttpRequest, ns: str) -> HttpResponse:
    """GET: the gate's figures and a confirm button. POST: advance (oncall may override with a reason)."""
    namespace = get_object_or_404(Namespace, name=ns)

    def page() -> HttpResponse:
        return render(
            request, "rollout/confirm_advance.html", _ctx(request, **_rollout_context(request, namespace))
        )

    if request.method != "POST":
        return page()
    try:
        override = _confirmed(request, "override", "Tick that you mean to advance with the gate shut.")
        stage, gate = stages.advance(
            principal=acting(request), namespace=ns, override=override, **_move(request)
        )
    except ClaimError as exc:
        return refused(request, exc, form="advance", again=page, back=lambda: redirect(request.path))
    if gate.holds:
        messages.success(request, f"Advanced to {stage}. Gate {gate.move}: {gate.why}.")
    else:
        messages.warning(
            request,
            f"Overridden: advanced to {stage} with the gate shut ({gate.why}). "
            f"Recorded as an override with your reason: {request.POST.get('reason', '').strip()}",
        )
    return redirect("console:rollout", ns=ns)


@require_POST
@role_required("oncall")
def rollback(request: HttpRequest, ns: str) -> HttpResponse:
    try:
        force = _confirmed(request, "force", "Tick that you mean to finish without a clean drain.")
        done = stages.rollback(principal=acting(request), namespace=ns, force=force, **_move(request))
    except ClaimError as exc:
        return refused(
            request, exc, form="rollback", again=lambda: rollout_page(request, ns), back=lambda: _home(ns)
        )
    if done.finished_at and done.forced:
        messages.warning(
            request,
            f"Forced: rolled back to {done.to_stage} without a clean drain — work still in flight was fenced, "
            "not finished. Claims stay paused until resumed.",
        )
    elif done.finished_at:
        messages.success(request, f"Rolled back to {done.to_stage}. Claims stay paused until resumed.")
    else:
        messages.warning(request, "Rollback started: fenced, waiting for the drain (see its progress below).")
    return _home(ns)


def _home(ns: str) -> HttpResponse:
    return redirect("console:rollout", ns=ns)


@require_POST
@role_required("operator")
def waive(request: HttpRequest, ns: str) -> HttpResponse:
    """Waive an acceptance point with no traffic in the window (the service's rules: a point, a real reason, the
    V1_READS stage; audited by it)."""
    point = request.POST.get("point", "")
    try:
        if request.POST.get("confirm_waive") != "on":  # the console's confirmation
            raise Invalid({"confirm_waive": [f"Tick that the gate may pass with no {point} traffic seen."]})
        stages.waive_coverage(
            principal=acting(request), namespace=ns, point=point, reason=request.POST.get("reason", "")
        )
    except ClaimError as exc:
        return refused(
            request,
            exc,
            form=f"waive-{point}" if point in selectors.POINTS else "waive",
            again=lambda: rollout_page(request, ns),
            back=lambda: _home(ns),
        )
    messages.warning(
        request,
        f"Waived: the coverage gate passes without {point} traffic in this stage. "
        f"Recorded with your reason: {request.POST.get('reason', '').strip()}",
    )
    return _home(ns)


def _filtered(ns: str, query: Any) -> tuple[Any, dict[str, str]]:
    """The namespace's mismatches as the list's filter (``reason``, ``status``, ``task``) shows them, newest first,
    at most 200 — and the filter, to keep it across a review."""
    chosen = {key: query.get(key, "") for key in ("reason", "status", "task")}
    rows = Mismatch.objects.filter(namespace=ns)
    if chosen["task"]:  # one task's mismatches (linked from its page)
        rows = rows.filter(task_id=chosen["task"])
    if chosen["reason"]:
        rows = rows.filter(reason=chosen["reason"])
    if chosen["status"]:
        rows = rows.filter(status=chosen["status"])
    return rows.order_by("-at")[:200], {key: value for key, value in chosen.items() if value}


@role_required("viewer")
def mismatches(request: HttpRequest, ns: str) -> HttpResponse:
    with one_snapshot():
        return _mismatches_page(request, ns, request.GET)


def _mismatches_page(request: HttpRequest, ns: str, query: Any) -> HttpResponse:
    namespace = get_object_or_404(Namespace, name=ns)
    rows, chosen = _filtered(ns, query)
    reason, status = chosen.get("reason", ""), chosen.get("status", "")
    grouped = (
        Mismatch.objects.filter(namespace=ns)
        .values("reason")
        .annotate(
            total=Count("id"),
            open=Count("id", filter=Q(status=MismatchStatus.OPEN)),
            bug=Count("id", filter=Q(status=MismatchStatus.BUG)),
        )
        .order_by("-total")
    )
    return render(
        request,
        "rollout/mismatches.html",
        _ctx(
            request,
            ns=namespace,
            incident=oncall_selectors.incident(namespace, clock.now()),
            taken_at=clock.now(),
            refresh_seconds=LIVE_REFRESH_SECONDS,
            rows=rows,
            grouped=grouped,
            kept_filter=chosen,
            reason=reason,
            status=status,
            reasons=list(MismatchReason.values),
            over_time=console.mismatches_per_hour(ns, clock.now()),
            observed=selectors.observer_positions(),
        ),
    )


@role_required("viewer")
def mismatch_detail(request: HttpRequest, mismatch_id: int) -> HttpResponse:
    mismatch = get_object_or_404(Mismatch, pk=mismatch_id)
    return render(
        request, "rollout/mismatch.html", _ctx(request, m=mismatch, **console.mismatch_drilldown(mismatch))
    )


@require_POST
@role_required("reviewer")
def mismatch_mark(request: HttpRequest, mismatch_id: int) -> HttpResponse:
    def back() -> HttpResponse:
        return redirect("console:mismatch", mismatch_id=mismatch_id)

    try:
        mismatch = mismatch_review(
            principal=acting(request),
            mismatch_id=mismatch_id,
            status=request.POST.get("status", ""),
            note=request.POST.get("note", ""),
        )
        messages.success(request, f"Mismatch {mismatch.pk} marked {mismatch.status}.")
        if request.POST.get("rule"):
            explain_rule_create(
                principal=acting(request),
                namespace=mismatch.namespace,
                reason=mismatch.reason,
                note=request.POST.get("note", ""),
            )
            messages.success(request, f"Future {mismatch.reason} mismatches will be marked EXPLAINED.")
    except ClaimError as exc:
        return refused(
            request, exc, form="review", again=lambda: mismatch_detail(request, mismatch_id), back=back
        )
    return back()


@require_POST
@role_required("reviewer")
def mismatches_review(request: HttpRequest, ns: str) -> HttpResponse:
    """Review several mismatches of the namespace with one note: each through the review service (its own
    transaction, audited), and what was refused is said."""
    shown, kept = _filtered(
        ns, {key[2:]: value for key, value in request.POST.items() if key.startswith("f_")}
    )
    back = reverse("console:mismatches", args=[ns]) + (f"?{urlencode(kept)}" if kept else "")
    if request.POST.get("all_shown") == "on":  # every mismatch the filter shows, not only those ticked
        chosen = [m.pk for m in shown]
    else:
        ids = [int(i) for i in request.POST.getlist("ids") if i.isdigit() and len(i) < 19]  # bigints only
        chosen = list(Mismatch.objects.filter(namespace=ns, pk__in=ids).values_list("pk", flat=True))
    if not chosen:
        messages.error(request, "Select at least one mismatch to review (or tick “all shown”).")
        return redirect(back)
    done = already = 0
    for mismatch_id in chosen:
        try:
            mismatch_review(
                principal=acting(request),
                mismatch_id=mismatch_id,
                status=request.POST.get("status", ""),
                note=request.POST.get("note", ""),
            )
            done += 1
        except InvalidTransition:  # already so: said below, the others still reviewed
            already += 1
        except ClaimError as exc:
            if not done:  # the first refused: nothing reviewed, the form again with its errors
                return refused(
                    request,
                    exc,
                    form="bulk-review",
                    again=lambda: _mismatches_page(request, ns, kept),
                    back=lambda: redirect(back),
                )
            report(request, exc)
            break
    if done:
        messages.success(
            request, f"{done} mismatch{'es' if done != 1 else ''} marked {request.POST.get('status')}."
        )
    if already:
        messages.info(
            request,
            f"{already} already {request.POST.get('status')}: left as they were (their review and note kept).",
        )
    return redirect(back)
