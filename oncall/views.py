"""The on-call pages of the console: the namespace overview, a namespace's incident page (its header, fences and
resume), the fence form, pools and the glance page. Every action checks the role and goes through a service,
which writes the audit log with the principal."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from kombu.exceptions import OperationalError

from claims import clock, services
from claims import selectors as core_selectors
from claims.errors import ClaimError
from claims.models import EventKind, Namespace, TaskEvent
from claims.services.principals import ui_role
from claims.ui import acting, bar_chart, report, role_required

from . import selectors
from . import services as oncall
from .extensions import pages_of
from .tasks import fence_epoch


def _ctx(request: HttpRequest, **extra) -> dict:
    return {"ui_role": ui_role(request.user), **extra}


def home_of(ns: str) -> str:
    """A namespace's page: the one an installed app names first (the rollout's), else its incident page."""
    pages = pages_of(ns)
    return pages[0]["href"] if pages else reverse("console:incident", args=[ns])


@role_required("viewer")
def overview(request: HttpRequest) -> HttpResponse:
    rows = [{**row, "home": home_of(row["ns"].name)} for row in selectors.overview()]
    return render(request, "oncall/overview.html", _ctx(request, rows=rows))


@role_required("viewer")
def incident_page(request: HttpRequest, ns: str) -> HttpResponse:
    """A namespace as on-call needs it: the incident header, its fences with their self-checks, resume."""
    namespace = get_object_or_404(Namespace, name=ns)
    context = _ctx(
        request,
        ns=namespace,
        incident=selectors.incident(namespace),
        fences=selectors.fence_history(ns),
        drain=selectors.drain_counts(namespace),
    )
    return render(request, "oncall/incident.html", context)


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
    context = _ctx(
        request,
        ns=namespace,
        incident=selectors.incident(namespace),
        typed=typed,
        errors=errors,
        home=home_of(ns),
    )
    return render(request, "oncall/fence.html", context, status=400 if errors else 200)


def _fence_requested(request: HttpRequest, ns: str, reason: str) -> HttpResponse:
    try:
        requested = oncall.fence_request(principal=acting(request), namespace=ns, reason=reason)
    except ClaimError as exc:
        report(request, exc)
        return redirect(home_of(ns))
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
    return redirect(home_of(ns))


@require_POST
@role_required("oncall")
def resume(request: HttpRequest, ns: str) -> HttpResponse:
    reason = request.POST.get("reason", "").strip()
    if not reason:
        messages.error(request, "A resume needs a reason (it is audited).")
        return redirect(home_of(ns))
    try:
        services.namespace_resume(principal=acting(request), namespace=ns, reason=reason)
        messages.success(request, "Claims resumed.")
    except ClaimError as exc:
        report(request, exc)
    return redirect(home_of(ns))


@role_required("viewer")
def pools(request: HttpRequest) -> HttpResponse:
    return render(request, "oncall/pools.html", _ctx(request, **selectors.pools_page()))


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
    return render(
        request,
        "oncall/glance.html",
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
            ready_p95=commits[int(0.95 * (len(commits) - 1))] if commits else None,
            commits=len(commits),
            unknown=core_selectors.unknown_effects_count(),
            activity=[
                (ns.name, selectors.activity_per_minute(ns, now)) for ns in Namespace.objects.order_by("name")
            ],
        ),
    )
