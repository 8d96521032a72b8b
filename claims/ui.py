"""What every operator page shares: roles from Django groups, and acting as the user's principal."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from .errors import ClaimError
from .models import Principal
from .selectors import effects_sent
from .services.principals import principal_for_user, ui_role

_RANK = {"viewer": 0, "reviewer": 1, "operator": 2, "oncall": 3}

# How often a live region of a console page asks again (htmx ``every``): a fence, a stage move or a drain shows
# within this on every open page.
LIVE_REFRESH_SECONDS = 3


TaskNote = Callable[[Any], "dict[str, Any] | None"]
_task_notes: list[TaskNote] = []


def task_note(function: TaskNote) -> TaskNote:
    """Register what an app wrapping the core says on a task's page (the rollout: which store's record the API
    answers in the task's stage, and that record): ``function(task)`` returns ``{"store", "why", "record"}`` or
    None. The core's page shows claim.v1's record and labels it so."""
    _task_notes.append(function)
    return function


def task_notes(task: Any) -> list[dict[str, Any]]:
    return [note for function in _task_notes if (note := function(task)) is not None]


EffectLabels = Callable[[Sequence[str]], "Mapping[str, dict[str, Any]]"]
_effect_labels: list[EffectLabels] = []


def effect_labels(function: EffectLabels) -> EffectLabels:
    """Register what an app wrapping the core knows of effects (the MCP gateway: the tool call behind an effect —
    its tool, arguments' digest and answer): ``function(effect_ids)`` maps some of them to a label dict, in one
    query for the page. The core's effect lists show it beside the effect."""
    _effect_labels.append(function)
    return function


def labelled(effects: Any) -> list[Any]:
    """The effects as a list, each with ``label`` (a dict, or None) from the registered functions, and ``sent``: True
    when a dispatch of it began that may have reached the target (its intent is recorded before the first byte
    leaves), False when every dispatch is known not to have left, None when it was never dispatched here (its
    worker called the target itself)."""
    rows = list(effects)
    labels: dict[str, dict[str, Any]] = {}
    for function in _effect_labels:
        labels.update(function([row.effect_id for row in rows]))
    sent = effects_sent([row.effect_id for row in rows])
    for row in rows:
        row.label = labels.get(row.effect_id)
        row.sent = sent.get(row.effect_id)
    return rows


def error_page(status: int, title: str, detail: str) -> HttpResponse:
    """The console's styled error page. It stands alone — no user, no session, no database — because a 500 may
    come from the database itself; if even the template fails, plain text."""
    try:
        body = render_to_string("errors/page.html", {"status": status, "title": title, "detail": detail})
    except Exception:  # noqa: BLE001 - an error page must answer whatever else is broken
        return HttpResponse(f"{status} {title}: {detail}\n", status=status, content_type="text/plain")
    return HttpResponse(body, status=status)


def role_required(role: str) -> Callable:
    """Allow users whose group is at least ``role`` (oncall ⊇ operator ⊇ reviewer ⊇ viewer); 403 otherwise."""

    def decorate(view: Callable) -> Callable:
        @login_required
        @wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if _RANK[ui_role(request.user)] < _RANK[role]:
                return error_page(
                    403,
                    "Not allowed",
                    f"Your role ({ui_role(request.user)}) may not do this; it needs {role}.",
                )
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def acting(request: HttpRequest) -> Principal:
    principal = principal_for_user(request.user)
    assert principal is not None, "role_required lets only reviewers, operators and oncall act"
    return principal


def report(request: HttpRequest, exc: ClaimError) -> None:
    """Show a refused action the way the API would say it."""
    body = exc.body()
    word = body.get("outcome", "ERROR")
    reason = body.get("reason")
    errors = body.get("errors", {})
    detail = body.get("detail") or "; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items())
    # The first field named: the page puts the keyboard there (static/console/focus.js).
    tags = f"field-{next(iter(errors))}" if errors else ""
    messages.error(
        request, f"{word}{f' ({reason})' if reason and reason != word else ''}: {detail}", extra_tags=tags
    )


def refused(
    request: HttpRequest,
    exc: ClaimError,
    *,
    form: str,
    again: Callable[[], HttpResponse],
    back: Callable[[], HttpResponse],
) -> HttpResponse:
    """A console form the service refused. Field errors (``Invalid``, the same the API answers 400 with): the page
    ``again``, status 400, each error beside its field (templatetags/console_forms.py) and what was typed kept —
    ``form`` names which form on the page. A 403 (the role may not do this with the form): the 403 page, as the
    API answers. Any other refusal (a 409's outcome word): said as the API says it, then ``back`` to the page."""
    if exc.status == 403:  # the role may use the form, not this use of it (an operator's override)
        return error_page(403, "Not allowed", str(exc.body().get("detail") or exc))
    report(request, exc)
    errors = exc.body().get("errors")
    if not errors:
        return back()
    request.refused = {  # type: ignore[attr-defined]
        "form": form,
        "errors": {name: " ".join(map(str, why)) for name, why in errors.items()},
        "typed": request.POST,
    }
    response = again()
    response.status_code = 400
    return response


def refusal(request: HttpRequest) -> dict[str, Any]:
    """Template context: the refused form of this request, if any (``refused``)."""
    return {"refused": getattr(request, "refused", None)}


def chart(
    *,
    kind: str,
    labels: list[str],
    series: Mapping[str, Sequence[float]],
    x: str,
    y: str,
    stacked: bool = False,
    colors: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What ``templates/_chart.html`` draws (Chart.js) and prints as its text alternative. ``colors`` fixes a
    series' colour where it carries meaning (a status: bad is red, good is green); the rest take the palette's."""
    return {
        "type": kind,
        "labels": labels,
        "datasets": [
            {"label": name, "data": data, **({"color": colors[name]} if colors and name in colors else {})}
            for name, data in series.items()
        ],
        "x": x,
        "y": y,
        "stacked": stacked,
        "rows": [[label, *[data[i] for data in series.values()]] for i, label in enumerate(labels)],
        "columns": list(series),
    }


def roles(request: HttpRequest) -> dict[str, Any]:
    """Template context: what the signed-in user's role may do — ``can_operate`` (operators and oncall: stages,
    reconciles, approvals, configuration) and ``can_review`` (reviewers too: shadow mismatches)."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {"can_operate": False, "can_review": False}
    rank = _RANK[ui_role(request.user)]
    return {"can_operate": rank >= _RANK["operator"], "can_review": rank >= _RANK["reviewer"]}
