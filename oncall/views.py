"""The on-call pages of the console: the namespace overview, a namespace's incident page (its header, fences and
resume), the fence form, pools and the glance page. Every action checks the role and goes through a service,
which writes the audit log with the principal."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from kombu.exceptions import OperationalError

from claims import clock, queues, services
from claims import selectors as core_selectors
from claims.errors import ClaimError, Invalid
from claims.models import Namespace
from claims.services.principals import ui_role
from claims.ui import LIVE_REFRESH_SECONDS, acting, report, role_required

from . import selectors
from . import services as oncall
from .extensions import pages_of


def _ctx(request: HttpRequest, **extra) -> dict:
    return {"ui_role": ui_role(request.user), **extra}


def home_of(ns: str) -> str:
    """A namespace's page: the one an installed app names first (the rollout's), else its incident page."""
    pages = pages_of(ns)
    return pages[0]["href"] if pages else reverse("console:incident", args=[ns])


@role_required("viewer")
def overview(request: HttpRequest) -> HttpResponse:
    """The incident board: a card per namespace, live (``?part=live`` is what htmx polls, as on a namespace page),
    with Fence and Resume on each card for on-call."""
    now = clock.now()
    rows = [{**row, "home": home_of(row["ns"].name)} for row in selectors.overview(now)]
    context = _ctx(request, rows=rows, taken_at=now, refresh_seconds=LIVE_REFRESH_SECONDS)
    if request.GET.get("part") == "live":
        return render(request, "oncall/_board.html", context)
    return render(request, "oncall/overview.html", context)


def _header(request: HttpRequest, namespace: Namespace) -> dict:
    """What oncall/_incident_live.html shows: the incident header as of now, and how often it is refreshed."""
    now = clock.now()
    return _ctx(
        request,
        ns=namespace,
        incident=selectors.incident(namespace, now),
        taken_at=now,
        refresh_seconds=LIVE_REFRESH_SECONDS,
    )


@role_required("viewer")
def incident_page(request: HttpRequest, ns: str) -> HttpResponse:
    """A namespace as on-call needs it: the incident header, its fences with their self-checks, resume.
    ``?part=header`` is the header alone: what the pages that show it poll (oncall/_incident_live.html)."""
    with core_selectors.one_snapshot():
        namespace = get_object_or_404(Namespace, name=ns)
        header = _header(request, namespace)
        if request.GET.get("part") == "header":
            return render(request, "oncall/_incident_live.html", header)
        context = {
            **header,
            "fences": selectors.fence_history(ns),
            "drain": selectors.drain_counts(namespace),
            "queue": queues.queue(namespace, header["taken_at"]),
        }
        return render(request, "oncall/incident.html", context)


@role_required("oncall")
def fence(request: HttpRequest, ns: str) -> HttpResponse:
    """GET: the fence form on a page of its own, under the incident header (one step from the overview and from
    every namespace page). POST: reason required and the namespace's name typed to confirm — a mistake answers the
    form again with the error beside its field and what was typed kept — then the fence job (with its self-check)."""
    namespace = get_object_or_404(Namespace, name=ns)
    typed = {"reason": request.POST.get("reason", ""), "confirm": request.POST.get("confirm", "").strip()}
    errors: dict[str, str] = {}
    if request.method == "POST":
        if typed["confirm"] != ns:  # the console's confirmation; the reason is the service's rule
            errors["confirm"] = f"Type the namespace's name, {ns}, exactly."
        try:
            if not errors:
                return _fence_requested(request, ns, typed["reason"])
            services.fence_reason(typed["reason"])  # said with the confirmation's error, not after it
        except Invalid as exc:
            errors |= {name: " ".join(why) for name, why in exc.errors.items()}
            if set(exc.errors) - {"reason", "confirm"}:  # not a field of the form (its fence_id): above it
                report(request, exc)
        except ClaimError as exc:
            report(request, exc)
            return redirect(home_of(ns))
    context = {**_header(request, namespace), "typed": typed, "errors": errors, "home": home_of(ns)}
    return render(request, "oncall/fence.html", context, status=400 if errors else 200)


def _fence_requested(request: HttpRequest, ns: str, reason: str) -> HttpResponse:
    """The fence, made in this request (``oncall.services.fence``: nothing waits for a job), then its self-check
    queued; the message says what is done and what is not yet. A refusal is raised to the form."""
    done = oncall.fence(
        principal=acting(request), namespace=ns, reason=reason, fence_id=_form_fence_id(request)
    )
    fenced = f"Fenced: epoch {done.scheduler_epoch}, new claims refused, every claim.v1 claim granted before it ended."
    try:
        oncall.fence_check_later(done)
        messages.success(request, f"{fenced} Its self-check runs as a job; the verdict appears under Fences.")
    except OperationalError:
        # The broker is down: the fence stands; resend_fences sends its check when the queue is back.
        messages.warning(
            request,
            f"{fenced} The self-check could not be queued (the job queue is unreachable): it runs when the queue "
            f"is back. To check now, run `python manage.py fence_check {done.fence_id}` on a server.",
        )
    return redirect(home_of(ns))


def _form_fence_id(request: HttpRequest) -> uuid.UUID | None:
    """The id the fence form carries, so that a second submit of the same form fences nothing more."""
    try:
        return uuid.UUID(request.POST.get("fence_id", ""))
    except ValueError:
        return None


@require_POST
@role_required("oncall")
def resume(request: HttpRequest, ns: str) -> HttpResponse:
    back = redirect("console:overview") if request.POST.get("back") == "board" else redirect(home_of(ns))
    try:  # the reason is optional (claim-v1.md: resume → 200 with nothing required); audited when given
        services.namespace_resume(
            principal=acting(request), namespace=ns, reason=request.POST.get("reason", "")
        )
    except ClaimError as exc:
        report(request, exc)
        return back
    messages.success(
        request, f"Resumed: claims are granted again in {ns} (the epoch stays; earlier claims stay fenced)."
    )
    return back


@role_required("viewer")
def pools(request: HttpRequest) -> HttpResponse:
    namespace = request.GET.get("ns", "").strip()
    return render(request, "oncall/pools.html", _ctx(request, **selectors.pools_page(namespace=namespace)))


@role_required("viewer")
def jobs(request: HttpRequest) -> HttpResponse:
    """Every job — scheduled by beat or sent by a service — with its interval, its last success and whether it is
    behind (none within two intervals: the alert JobBehind pages then, linking here), its outcomes in the last
    hour, and its last runs with their durations and errors (``claims.selectors.jobs_overview``, /metrics' figures)."""
    now = clock.now()
    return render(
        request, "oncall/jobs.html", _ctx(request, jobs=core_selectors.jobs_overview(now), taken_at=now)
    )


@role_required("viewer")
def glance(request: HttpRequest) -> HttpResponse:
    """Claims, fenced commits, reclaim latency and ready→commit over the last hour, per minute — from the metric
    tallies (``claims.metrics.read_minutes``), bounded by the clock read first: its cost does not grow with the
    hour's events, and an event written while the page renders waits for the next load."""
    now = clock.now()
    return render(request, "oncall/glance.html", _ctx(request, taken_at=now, **selectors.glance(now)))
