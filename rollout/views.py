"""The operator console (server-rendered): namespaces, the rollout page, fences, mismatches, pools, metrics.
Every action checks the role and goes through a service, which writes the audit log with the principal."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from django.contrib import messages
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from kombu.exceptions import OperationalError

from claims import clock, services
from claims import selectors as core_selectors
from claims.errors import ClaimError
from claims.models import (
    EventKind,
    Namespace,
    TaskEvent,
)
from claims.services.principals import ui_role
from claims.ui import acting, bar_chart, report, role_required

from . import selectors
from .models import (
    DrainSnapshot,
    GateEvaluation,
    Mismatch,
    MismatchReason,
    MismatchStatus,
    Rollback,
    Stage,
    StageChange,
)
from .services import fences, stages
from .services.reviews import explain_rule_create, mismatch_review
from .tasks import fence_epoch


def _ctx(request: HttpRequest, **extra) -> dict:
    return {"ui_role": ui_role(request.user), **extra}


@role_required("viewer")
def overview(request: HttpRequest) -> HttpResponse:
    rows = []
    now = clock.now()
    open_by_ns = dict(
        Mismatch.objects.filter(status__in=[MismatchStatus.OPEN, MismatchStatus.BUG])
        .values_list("namespace")
        .annotate(n=Count("id"))
    )
    for ns in Namespace.objects.select_related("rollout").order_by("name"):
        drain = selectors.drain_counts(ns, now=now)
        rows.append(
            {
                "ns": ns,
                "stage": selectors.stage_of(ns),
                "drain": drain,
                "mismatches": open_by_ns.get(ns.name, 0),
            }
        )
    return render(request, "rollout/overview.html", _ctx(request, rows=rows))


def _linked(checklist: list[dict], ns: str) -> list[dict]:
    """Each checklist row's ``link`` (a console page and its query) as an address."""
    for row in checklist:
        if row["link"]:
            name, query = row["link"]
            url = reverse(name, args=[ns] if name == "console:mismatches" else [])
            row["href"] = f"{url}?{query}" if query else url
    return checklist


# How often a live region asks again (htmx ``every``): a pending fence shows its new epoch within this.
LIVE_REFRESH_SECONDS = 3


def _rollout_context(request: HttpRequest, ns: Namespace) -> dict:
    stage = selectors.stage_of(ns)
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
        "drain_chart": selectors.drain_progress(ns.name),
        "ns": ns,
        "steps": steps,
        "gate": gate,
        "stage": stage,
        "gate_age": selectors.age_seconds(gate.at) if gate else None,
        "next_stage": selectors.next_stage(stage),
        "earlier": order[:here],
        "coverage": coverage,
        "coverage_chart": selectors.coverage_chart(coverage),
        "drains": drains,
        "rollback": Rollback.objects.filter(namespace=ns.name).order_by("-started_at").first(),
        "open_rollback": selectors.open_rollback(ns.name),
        "incident": selectors.incident(ns, now),
        "checklist": _linked(selectors.gate_checklist(ns, gate, coverage), ns.name),
        "fences": selectors.fence_history(ns.name),
        "changes": StageChange.objects.filter(namespace=ns.name).order_by("-at")[:10],
        "last_gates": [
            GateEvaluation.objects.filter(namespace=ns.name, move=f"{a} → {b}").order_by("-at").first()
            or {"move": f"{a} → {b}", "never": True}
            for a, b in zip(order, order[1:], strict=False)
        ],
    }


@role_required("viewer")
def rollout_page(request: HttpRequest, ns: str) -> HttpResponse:
    """The namespace's rollout page; ``?part=live`` (htmx polls it) renders only the live region — stage, epoch,
    pause, gate, drain, rollback, fences — so the forms below keep what an operator is typing."""
    namespace = get_object_or_404(Namespace, name=ns)
    context = _ctx(request, **_rollout_context(request, namespace))
    if request.GET.get("part") == "live":
        return render(request, "rollout/_live.html", context)
    return render(request, "rollout/rollout.html", context)


@role_required("operator")
def advance(request: HttpRequest, ns: str) -> HttpResponse:
    """GET: the gate's figures and a confirm button. POST: advance (oncall may override with a reason)."""
    namespace = get_object_or_404(Namespace, name=ns)
    if request.method != "POST":
        return render(
            request, "rollout/confirm_advance.html", _ctx(request, **_rollout_context(request, namespace))
        )
    try:
        stage, gate = stages.advance(
            principal=acting(request),
            namespace=ns,
            to_stage=request.POST.get("to_stage", ""),
            reason=request.POST.get("reason", ""),
            override=bool(request.POST.get("override")),
        )
        messages.success(request, f"Advanced to {stage}. Gate {gate.move}: {gate.why}.")
    except ClaimError as exc:
        report(request, exc)
    return redirect("console:rollout", ns=ns)


@require_POST
@role_required("oncall")
def rollback(request: HttpRequest, ns: str) -> HttpResponse:
    try:
        done = stages.rollback(
            principal=acting(request),
            namespace=ns,
            to_stage=request.POST.get("to_stage", ""),
            reason=request.POST.get("reason", "").strip() or "rollback from the console",
            force=bool(request.POST.get("force")),
        )
        if done.finished_at:
            messages.success(request, f"Rolled back to {done.to_stage}. Claims stay paused until resumed.")
        else:
            messages.warning(
                request, "Rollback started: fenced, waiting for the drain (see its progress below)."
            )
    except ClaimError as exc:
        report(request, exc)
    return redirect("console:rollout", ns=ns)


@role_required("oncall")
def fence(request: HttpRequest, ns: str) -> HttpResponse:
    """GET: the fence form on a page of its own, under the incident header (one step from the overview and from
    every namespace page). POST: reason required and the namespace's name typed to confirm — a mistake answers the
    form again with the error beside its field and what was typed kept — then the fence job (with its self-check)."""
    namespace = get_object_or_404(Namespace, name=ns)
    typed = {
        "reason": request.POST.get("reason", "").strip(),
        "confirm": request.POST.get("confirm", "").strip(),
    }
    errors: dict[str, str] = {}
    if request.method == "POST":
        if not typed["reason"]:
            errors["reason"] = "A fence needs a reason: it goes to the audit log."
        if typed["confirm"] != ns:
            errors["confirm"] = f"Type the namespace's name, {ns}, exactly."
        if not errors:
            return _fence_requested(request, ns, typed["reason"])
    context = _ctx(request, ns=namespace, incident=selectors.incident(namespace), typed=typed, errors=errors)
    return render(request, "rollout/fence.html", context, status=400 if errors else 200)


def _fence_requested(request: HttpRequest, ns: str, reason: str) -> HttpResponse:
    try:
        requested = fences.fence_request(principal=acting(request), namespace=ns, reason=reason)
    except ClaimError as exc:
        report(request, exc)
        return redirect("console:rollout", ns=ns)
    try:
        fence_epoch.delay(ns, reason, requested.principal, str(requested.fence_id))
        messages.success(
            request,
            "Fence requested. The new epoch and the self-check appear under Fences when its job finishes.",
        )
    except OperationalError:
        # The broker is down: the request is kept, and resend_fences sends it when the queue is back.
        messages.warning(
            request,
            "Fence recorded, but the job queue is unreachable: it runs when the queue is back. To fence now, "
            f"run `python manage.py fence {ns} --reason … --as <oncall>` on a server.",
        )
    return redirect("console:rollout", ns=ns)


@require_POST
@role_required("operator")
def waive(request: HttpRequest, ns: str) -> HttpResponse:
    """Waive an acceptance point with no traffic in the window (reason required; audited by the service)."""
    reason, point = request.POST.get("reason", "").strip(), request.POST.get("point", "")
    if point not in selectors.POINTS:
        messages.error(request, f"No acceptance point {point!r}: one of {', '.join(selectors.POINTS)}.")
    elif not reason:
        messages.error(request, f"A waiver of {point} needs a reason.")
    else:
        try:
            stages.waive_coverage(principal=acting(request), namespace=ns, point=point, reason=reason)
            messages.success(request, f"{point} waived for this stage: {reason}")
        except ClaimError as exc:
            report(request, exc)
    return redirect("console:rollout", ns=ns)


@require_POST
@role_required("oncall")
def resume(request: HttpRequest, ns: str) -> HttpResponse:
    reason = request.POST.get("reason", "").strip()
    if not reason:
        messages.error(request, "A resume needs a reason (it is audited).")
        return redirect("console:rollout", ns=ns)
    try:
        services.namespace_resume(principal=acting(request), namespace=ns, reason=reason)
        messages.success(request, "Claims resumed.")
    except ClaimError as exc:
        report(request, exc)
    return redirect("console:rollout", ns=ns)


@role_required("viewer")
def mismatches(request: HttpRequest, ns: str) -> HttpResponse:
    namespace = get_object_or_404(Namespace, name=ns)
    rows = Mismatch.objects.filter(namespace=ns)
    reason, status = request.GET.get("reason", ""), request.GET.get("status", "")
    if task_id := request.GET.get("task", ""):  # one task's mismatches (linked from its page)
        rows = rows.filter(task_id=task_id)
    if reason:
        rows = rows.filter(reason=reason)
    if status:
        rows = rows.filter(status=status)
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
            incident=selectors.incident(namespace),
            rows=rows.order_by("-at")[:200],
            grouped=grouped,
            reason=reason,
            status=status,
            reasons=list(MismatchReason.values),
            over_time=selectors.mismatches_per_hour(ns, clock.now()),
        ),
    )


@role_required("viewer")
def mismatch_detail(request: HttpRequest, mismatch_id: int) -> HttpResponse:
    mismatch = get_object_or_404(Mismatch, pk=mismatch_id)
    return render(
        request, "rollout/mismatch.html", _ctx(request, m=mismatch, **selectors.mismatch_drilldown(mismatch))
    )


@require_POST
@role_required("operator")
def mismatch_mark(request: HttpRequest, mismatch_id: int) -> HttpResponse:
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
        report(request, exc)
    return redirect("console:mismatch", mismatch_id=mismatch_id)


@require_POST
@role_required("operator")
def mismatches_review(request: HttpRequest, ns: str) -> HttpResponse:
    """Review several mismatches of the namespace with one note: each through the review service (its own
    transaction, audited), and what was refused is said."""
    ids = [int(i) for i in request.POST.getlist("ids") if i.isdigit() and len(i) < 19]  # bigints only
    chosen = list(Mismatch.objects.filter(namespace=ns, pk__in=ids).values_list("pk", flat=True))
    if not chosen:
        messages.error(request, "Select at least one mismatch to review.")
        return redirect("console:mismatches", ns=ns)
    done = 0
    for mismatch_id in chosen:
        try:
            mismatch_review(
                principal=acting(request),
                mismatch_id=mismatch_id,
                status=request.POST.get("status", ""),
                note=request.POST.get("note", ""),
            )
            done += 1
        except ClaimError as exc:
            report(request, exc)
            break
    if done:
        messages.success(
            request, f"{done} mismatch{'es' if done != 1 else ''} marked {request.POST.get('status')}."
        )
    return redirect("console:mismatches", ns=ns)


@role_required("viewer")
def pools(request: HttpRequest) -> HttpResponse:
    return render(request, "rollout/pools.html", _ctx(request, **selectors.pools_page()))


@role_required("viewer")
def glance(request: HttpRequest) -> HttpResponse:
    """Claim rate, fenced commits, reclaim latency and ready→commit p95 over the last hour, from the timeline."""
    now = clock.now()
    since = now - timedelta(hours=1)
    events = TaskEvent.objects.filter(at__gte=since)

    def per_minute(kinds=None, **filters):
        rows = events.filter(**filters)
        if kinds:
            rows = rows.filter(kind__in=kinds)
        counts = Counter(int((now - at).total_seconds() // 60) for at in rows.values_list("at", flat=True))
        return [(f"{m} min ago", counts.get(m, 0)) for m in range(59, -1, -1)]

    claims_series = per_minute([EventKind.CLAIMED, EventKind.RECLAIMED])
    fenced_commits = per_minute(kind=EventKind.FENCED, point="commit")
    reclaims = core_selectors.reclaim_latencies(since=since)
    commits = sorted(core_selectors.ready_to_commit_seconds(since=since))
    p95 = commits[int(0.95 * (len(commits) - 1))] if commits else None
    return render(
        request,
        "rollout/glance.html",
        _ctx(
            request,
            claims_chart=bar_chart(claims_series, unit=" claims"),
            claims_total=sum(v for _, v in claims_series),
            fenced_chart=bar_chart(fenced_commits, unit=" fenced commits"),
            fenced_total=sum(v for _, v in fenced_commits),
            reclaim_chart=bar_chart(
                [(f"reclaim {i + 1}", v) for i, v in enumerate(reclaims[-60:])], unit=" s"
            ),
            reclaim_max=max(reclaims) if reclaims else None,
            ready_p95=p95,
            commits=len(commits),
            unknown=core_selectors.unknown_effects_count(),
            stage_order=Stage.values,
            activity=[
                (ns.name, selectors.activity_per_minute(ns, now)) for ns in Namespace.objects.order_by("name")
            ],
        ),
    )
