"""One rulebook at every door (issue 36): every action the console's forms, the REST API and ``claimctl`` offer is
listed here with a valid request, and for each the same invalid request — a required field missing, empty or only
whitespace, the wrong stage, the wrong role — is refused at every door that offers the action, with nothing
written and nothing audited. The lists are found, not typed: every ``<form method="post">`` of the console's
templates, every API route that writes, and every ``claimctl`` command; one without a case here fails the test."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command, get_commands
from django.urls import URLPattern, URLResolver, get_resolver

from claims.models import AuditEntry, Namespace, Principal
from claims.services import epoch_fence
from controlplane.cli import MANAGEMENT
from gateway.services import downstream_save
from rollout.models import Mismatch
from rollout.services import stages
from tests.support.actors import make_actor
from tests.support.console import login

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).resolve().parents[2] / "controlplane" / "templates"
Body = Callable[[SimpleNamespace], dict[str, Any]]


@dataclass(frozen=True)
class Action:
    """One action and its doors. ``api`` is (method, path), ``console`` a path, ``cli`` the argv of a management
    command (each from the scene and the request's fields, ``None`` for a field left out). ``text``: fields that
    must be real text; ``required``: other fields that must be there; ``wrong_stage``: fields that make the
    request wrong for the scene's stage (a 409 with the contract's word)."""

    may: str
    may_not: str
    body: Body
    api: tuple[str, str] | None = None
    console: str | None = None
    form: Body | None = None  # the console's form, when it differs from the API's body
    cli: Callable[[SimpleNamespace, dict[str, Any], str], list[str]] | None = None
    text: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    stage: str = "V1_READS"
    wrong_stage: dict[str, Any] | None = None
    wrong_stage_word: str = ""
    blank_status: tuple[int, ...] = (400,)  # a worker's blank owner_id is someone else: 403 is a refusal too
    scene: tuple[str, ...] = field(default=())
    cli_missing: bool = (
        True  # a missing option is a refusal at the CLI (not when leaving it out is another command)
    )


def _flag(name: str, on: Any) -> list[str]:
    return [name] if on else []


def _opt(name: str, value: Any) -> list[str]:
    return [] if value is None else [name, str(value)]


def _rollout_cli(verb: str) -> Callable[[SimpleNamespace, dict[str, Any], str], list[str]]:
    def argv(s: SimpleNamespace, b: dict[str, Any], who: str) -> list[str]:
        return [
            "rollout", verb, s.ns, *_opt("--to", b.get("to_stage")), *_opt("--reason", b.get("reason")),
            *_flag("--override", b.get("override")), *_flag("--force", b.get("force")), "--as", who,
        ]  # fmt: skip

    return argv


def _attempt(s: SimpleNamespace, claim: dict) -> dict[str, Any]:
    return {
        "attempt_id": claim["attempt_id"],
        "claim_generation": claim["claim_generation"],
        "scheduler_epoch": claim["scheduler_epoch"],
        "owner_id": s.agent.name,
    }


ACTIONS: dict[str, Action] = {
    # --- the rollout: stages, waivers, drains, mismatches -------------------------------------------------------
    "advance": Action(
        may="oncall",
        may_not="operator",  # an operator may advance, not override
        stage="SHADOW",
        body=lambda s: {"to_stage": "V1_READS", "override": True, "reason": "drill: the gate is known shut"},
        form=lambda s: {
            "to_stage": "V1_READS",
            "override": "on",
            "confirm_override": "on",
            "reason": "drill: the gate is known shut",
        },
        api=("post", "/api/v1/namespaces/{ns}/rollout/advance"),
        console="/ns/{ns}/advance",
        cli=_rollout_cli("advance"),
        text=("reason",),
        required=("to_stage",),
        wrong_stage={"to_stage": "V1_ONLY"},
        wrong_stage_word="INVALID_TRANSITION",
    ),  # fmt: skip
    "rollback": Action(
        may="oncall",
        may_not="operator",
        stage="V1_READS",
        body=lambda s: {"to_stage": "SHADOW", "force": True, "reason": "winner mismatches in V1_READS"},
        form=lambda s: {
            "to_stage": "SHADOW",
            "force": "on",
            "confirm_force": "on",
            "reason": "winner mismatches in V1_READS",
        },
        api=("post", "/api/v1/namespaces/{ns}/rollout/rollback"),
        console="/ns/{ns}/rollback",
        cli=_rollout_cli("rollback"),
        text=("reason",),
        required=("to_stage",),
        wrong_stage={"to_stage": "V1_WRITES"},
        wrong_stage_word="INVALID_TRANSITION",
    ),  # fmt: skip
    "waive": Action(
        may="operator",
        may_not="reviewer",
        stage="V1_READS",
        body=lambda s: {"point": "effect", "reason": "no effects in this namespace"},
        form=lambda s: {"point": "effect", "reason": "no effects in this namespace", "confirm_waive": "on"},
        api=("post", "/api/v1/namespaces/{ns}/coverage/waive"),
        console="/ns/{ns}/waive",
        text=("reason",),
        required=("point",),
    ),  # fmt: skip
    "waive-in-the-wrong-stage": Action(
        may="operator",
        may_not="reviewer",
        stage="LEGACY",
        body=lambda s: {"point": "effect", "reason": "no effects in this namespace"},
        form=lambda s: {"point": "effect", "reason": "no effects in this namespace", "confirm_waive": "on"},
        api=("post", "/api/v1/namespaces/{ns}/coverage/waive"),
        console="/ns/{ns}/waive",
        wrong_stage={},
        wrong_stage_word="INVALID_TRANSITION",
    ),  # fmt: skip
    "drain": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {},
        api=("post", "/api/v1/namespaces/{ns}/drain"),
    ),
    "review": Action(
        may="reviewer",
        may_not="viewer",
        stage="SHADOW",
        body=lambda s: {"status": "EXPLAINED", "note": "the drill's injected writer"},
        api=("post", "/api/v1/mismatches/{mismatch}/review"),
        console="/mismatches/{mismatch}/mark",
        text=("note",),
        required=("status",),
    ),  # fmt: skip
    "bulk-review": Action(
        may="reviewer",
        may_not="viewer",
        stage="SHADOW",
        body=lambda s: {"ids": [s.mismatch], "status": "EXPLAINED", "note": "the drill's injected writer"},
        console="/ns/{ns}/mismatches/review",
        text=("note",),
        required=("status",),
    ),  # fmt: skip
    "explain-rule": Action(
        may="reviewer",
        may_not="viewer",
        stage="SHADOW",
        body=lambda s: {"reason": "STALE_COMMIT_ACCEPTED", "note": "legacy writers finish late by design"},
        api=("post", "/api/v1/namespaces/{ns}/explain-rules"),
        text=("note",),
        required=("reason",),
    ),  # fmt: skip
    "namespace-create": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"name": "fresh", "stage": "LEGACY"},
        api=("post", "/api/v1/namespaces"),
        required=("name",),
    ),
    # --- on-call: fences and resumes ----------------------------------------------------------------------------
    "fence": Action(
        may="oncall",
        may_not="operator",
        body=lambda s: {"reason": "stale writer in SHADOW"},
        form=lambda s: {"reason": "stale writer in SHADOW", "confirm": s.ns},
        api=("post", "/api/v1/namespaces/{ns}/fence"),
        console="/ns/{ns}/fence",
        cli=lambda s, b, who: ["fence", s.ns, *_opt("--reason", b.get("reason")), "--as", who],
        text=("reason",),
    ),  # fmt: skip
    "resume": Action(
        # claim-v1.md: POST …/resume → 200 with no field required; its reason is optional at every door (audited
        # when given), so a blank one is not a refusal anywhere. The wrong role is.
        may="oncall",
        may_not="operator",
        scene=("paused",),
        body=lambda s: {"reason": "the writer is gone"},
        api=("post", "/api/v1/namespaces/{ns}/resume"),
        console="/ns/{ns}/resume",
    ),  # fmt: skip
    # --- effects, tasks and resources ---------------------------------------------------------------------------
    "reconcile": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"observed": "NOT_OCCURRED", "reason": "the target has no such order"},
        form=lambda s: {
            "observed": "NOT_OCCURRED",
            "reason": "the target has no such order",
            "confirm": "on",
        },
        api=("post", "/api/v1/effects/{effect_unknown}/reconcile"),
        console="/effects/{effect_unknown}/reconcile",
        text=("reason",),
        required=("observed",),
    ),  # fmt: skip
    "approve": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"note": "change #88 reviewed"},
        api=("post", "/api/v1/effects/{effect_approve}/approve"),
        console="/effects/{effect_approve}/approve",
    ),  # fmt: skip
    "task-create": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"node_id": "n", "input": {"n": 2}},
        api=("post", "/api/v1/tasks"),
        required=("node_id",),
    ),
    "task-input": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"input": {"n": 3}},
        api=("post", "/api/v1/tasks/{task_ready}/input"),
        required=("input",),
    ),
    "task-cancel": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"reason": "not needed"},
        api=("post", "/api/v1/tasks/{task_ready}/cancel"),
        text=("reason",),
    ),
    "task-priority": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"priority": 1, "reason": "incident #7: this first"},
        api=("post", "/api/v1/tasks/{task_ready}/priority"),
        console="/tasks/{task_ready}/priority",
        text=("reason",),
        required=("priority",),
    ),
    "task-requeue": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {},
        api=("post", "/api/v1/tasks/{task_ready}/requeue"),
        wrong_stage={},
        wrong_stage_word="INVALID_TRANSITION",
    ),  # fmt: skip
    "resource-create": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"resource_key": "res-2"},
        api=("post", "/api/v1/resources"),
        required=("resource_key",),
    ),
    "resource-delete": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {},
        api=("delete", "/api/v1/resources/{resource}"),
    ),
    # --- the gateway's configuration ----------------------------------------------------------------------------
    "gateway-downstream": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"url": "http://127.0.0.1:9/mcp"},
        form=lambda s: {"name": "srv2", "url": "http://127.0.0.1:9/mcp", "transport": "http"},
        api=("put", "/api/v1/gateway/downstreams/{new_server}"),
        console="/gateway/downstreams",
        cli=lambda s, b, who: [
            "gateway",
            "set-downstream",
            "srv2",
            *_opt("--url", b.get("url")),
            "--as",
            who,
        ],
        text=("url",),
    ),  # fmt: skip
    "gateway-rule": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"kind": "READ_ONLY"},
        form=lambda s: {"downstream": "srv", "tool": "lookup", "kind": "READ_ONLY"},
        api=("put", "/api/v1/gateway/rules/{server}/{tool}"),
        console="/gateway/rules",
        cli=lambda s, b, who: [
            "gateway",
            "set-rule",
            "srv",
            "lookup",
            *_opt("--kind", b.get("kind")),
            "--as",
            who,
        ],
    ),  # fmt: skip
    # --- claimctl alone -----------------------------------------------------------------------------------------
    "revoke-token": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {"reason": "leaked in a log"},
        cli=lambda s, b, who: [
            "revoke_token",
            s.agent.token[:10],
            *_opt("--reason", b.get("reason")),
            "--as",
            who,
            "--yes",  # confirmed: what is refused is the request itself
        ],
        text=("reason",),
    ),  # fmt: skip
    "resnapshot": Action(
        may="oncall",
        may_not="operator",
        body=lambda s: {"reason": "the slot was lost in the failover"},
        cli=lambda s, b, who: [
            "legacy_observe",
            *_opt("--resnapshot", b.get("reason")),
            "--as",
            who,
            "--yes",
        ],
        text=("reason",),
        cli_missing=False,  # without --resnapshot the command observes: another action
    ),  # fmt: skip
    "legacy-import": Action(
        may="operator",
        may_not="reviewer",
        body=lambda s: {},
        cli=lambda s, b, who: ["legacy_import", s.ns, "--as", who],
    ),  # fmt: skip
}


def _worker(path: str, body: Body, required: tuple[str, ...], **more: Any) -> Action:
    """A worker's call: it has one door, the API (the gateway's calls go through the same services)."""
    return Action(may="worker", may_not="operator", body=body, api=("post", path), required=required, **more)


ACTIONS |= {
    "claim": _worker(
        "/api/v1/tasks/{task_ready}/claim",
        lambda s: {"owner_id": s.agent.name, "scheduler_epoch": 1, "ttl_seconds": 30},
        ("owner_id", "scheduler_epoch"),
        text=("owner_id",),
        blank_status=(400, 403),
    ),  # fmt: skip
    "claim-next": _worker(
        "/api/v1/claims",
        lambda s: {"owner_id": s.agent.name, "scheduler_epoch": 1, "ttl_seconds": 30},
        ("owner_id",),
        text=("owner_id",),
        blank_status=(400, 403),
    ),  # fmt: skip
    "claim-batch": _worker(
        "/api/v1/claims/batch",
        lambda s: {"owner_id": s.agent.name, "scheduler_epoch": 1, "ttl_seconds": 30, "max_tasks": 2},
        ("owner_id", "max_tasks"),
        text=("owner_id",),
        blank_status=(400, 403),
    ),  # fmt: skip
    "renew": _worker(
        "/api/v1/tasks/{task_claimed}/renew",
        lambda s: {**_attempt(s, s.claim), "cancel_generation": 0, "extend_seconds": 30},
        ("attempt_id", "claim_generation"),
        text=("owner_id",),
        blank_status=(400, 403),
    ),  # fmt: skip
    "release": _worker(
        "/api/v1/tasks/{task_claimed}/release",
        lambda s: _attempt(s, s.claim),
        ("attempt_id",),
        text=("owner_id",),
        blank_status=(400, 403),
    ),  # fmt: skip
    "results": _worker(
        "/api/v1/tasks/{task_claimed}/results",
        lambda s: {
            k: v
            for k, v in s.agent.commit_body(s.claim, {"ok": 1}, inline=True).items()
            if k in ("attempt_id", "claim_generation", "result", "result_digest")
        },
        ("attempt_id", "result_digest"),
    ),  # fmt: skip
    "commit": _worker(
        "/api/v1/tasks/{task_claimed}/commit",
        lambda s: s.agent.commit_body(s.claim, {"ok": 1}, inline=True),
        ("attempt_id", "result_digest"),
    ),
    "commits": _worker(
        "/api/v1/commits",
        lambda s: {
            "commits": [{"task_id": s.task_claimed, **s.agent.commit_body(s.claim, {"ok": 1}, inline=True)}]
        },
        ("commits",),
    ),  # fmt: skip
    "prepare": _worker(
        "/api/v1/effects/prepare",
        lambda s: {
            "task_id": s.task_claimed,
            "effect_slot": "s2",
            "payload_digest": "0" * 64,
            **_attempt(s, s.claim),
        },
        ("effect_slot", "payload_digest"),
        text=("effect_slot",),
    ),  # fmt: skip
    "outcome": _worker(
        "/api/v1/effects/{effect_prepared}/outcome",
        lambda s: {"state": "COMMITTED", **_attempt(s, s.claim)},
        ("state",),
    ),  # fmt: skip
    "dispatch": _worker(
        "/api/v1/effects/{effect_prepared}/dispatch",
        lambda s: {"payload": {"n": 1}, "target": "http://127.0.0.1:9/act", **_attempt(s, s.claim)},
        ("target",),
        text=("target",),
    ),  # fmt: skip
    "register": _worker(
        "/api/v1/workers/register",
        lambda s: {"protocol": "claim.v1", "binary_version": "1.0"},
        ("protocol", "binary_version"),
        text=("protocol", "binary_version"),
    ),  # fmt: skip
    "heartbeat": _worker("/api/v1/workers/heartbeat", lambda s: {}, ()),
    "resource-check": Action(
        may="worker",
        may_not="nobody",
        body=lambda s: {"fence_token": 1, "incarnation": s.incarnation},
        api=("post", "/api/v1/resources/{resource}/check"),
        required=("fence_token",),
    ),  # fmt: skip
    "legacy-claim": _worker(
        "/api/legacy/tasks/{task_legacy}/claim",
        lambda s: {"owner_id": s.agent.name, "ttl_seconds": 30},
        ("owner_id",),
        text=("owner_id",),
        stage="LEGACY",
        blank_status=(400, 403),
    ),  # fmt: skip
    "legacy-heartbeat": _worker(
        "/api/legacy/tasks/{task_legacy}/heartbeat",
        lambda s: {"owner_id": s.agent.name, "ttl_seconds": 30},
        ("owner_id",),
        text=("owner_id",),
        stage="LEGACY",
        blank_status=(400, 403),
    ),  # fmt: skip
    "legacy-release": _worker(
        "/api/legacy/tasks/{task_legacy}/release",
        lambda s: {"owner_id": s.agent.name},
        ("owner_id",),
        text=("owner_id",),
        stage="LEGACY",
        blank_status=(400, 403),
    ),  # fmt: skip
    "legacy-complete": _worker(
        "/api/legacy/tasks/{task_legacy}/complete",
        lambda s: {"owner_id": s.agent.name, "result": {"ok": 1}, "result_digest": "0" * 64},
        ("owner_id",),
        text=("owner_id",),
        stage="LEGACY",
        blank_status=(400, 403),
    ),  # fmt: skip
}

# claimctl commands that are not actions on the control plane's records, and why.
NOT_ACTIONS = {
    "create_ui_user": "a console sign-in for a group; whoever runs it holds the server (and the database)",
    "drain_check": "reads the drain figures",
    "legacy_check": "reads the legacy table and the database's settings (a pre-flight)",
    "fence_check": "re-runs a fence's self-check: reads, records only the verdict of a fence already audited",
    "issue_token": "whoever runs it holds the server (and the database); the new principal is its record",
}
# Console forms that are not the control plane's actions.
NOT_CONSOLE_ACTIONS = {"logout": "Django's own sign-out"}
# API routes whose POST reads (an advisory check; nothing is written whatever it is sent).
READS = {"resource-check"}


# --- what is there to find ---------------------------------------------------------------------------------------


def _routes(patterns: list, prefix: str = "") -> list[tuple[str, Any]]:
    found = []
    for p in patterns:
        if isinstance(p, URLResolver):
            found += _routes(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            found.append((prefix + str(p.pattern), p.callback))
    return found


def _api_writes() -> set[str]:
    writes = set()
    for route, view in _routes(get_resolver().url_patterns):
        cls = getattr(view, "cls", None) or getattr(getattr(view, "__wrapped__", None), "cls", None)
        if route.startswith("api/") and cls is not None:
            for method in ("post", "put", "patch", "delete"):
                if hasattr(cls, method):
                    writes.add(f"{method} /{_braced(route)}")
    return writes


def _console_forms() -> set[str]:
    names = set()
    for template in TEMPLATES.rglob("*.html"):
        if template.parent.name == "registration":  # Django's sign-in page
            continue
        for form in re.finditer(r"<form\b[^>]*>", template.read_text()):
            if re.search(r'method="post"', form.group(0), re.I):
                target = re.search(r"action=\"\{% url '(?:console:)?([\w-]+)'", form.group(0))
                assert target, f"{template.name}: a POST form without a named action: {form.group(0)}"
                names.add(target.group(1))
    return names


def _normalise(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def test_every_door_of_every_action_has_a_case():
    """An action added to the console, the API or claimctl without a case here fails this test."""
    api_cases = {f"{a.api[0]} {_normalise(a.api[1])}" for a in ACTIONS.values() if a.api}
    missing_api = {w for w in _api_writes() if _normalise(w) not in api_cases}
    console_cases = {_normalise(a.console) for a in ACTIONS.values() if a.console}
    routes = {p.name: _normalise("/" + _braced(str(p.pattern))) for p in _console_patterns()}
    forms = _console_forms() - set(NOT_CONSOLE_ACTIONS)
    missing_forms = {name for name in forms if routes[name] not in console_cases}
    cli_cases = {a.cli(_scene_stub(), {}, "x")[0] for a in ACTIONS.values() if a.cli}
    missing_cli = _our_commands() - set(NOT_ACTIONS) - cli_cases

    assert not missing_api, f"API actions with no case: {sorted(missing_api)}"
    assert not missing_forms, f"console forms with no case: {sorted(missing_forms)}"
    assert not missing_cli, f"claimctl commands with no case: {sorted(missing_cli)}"
    assert len(forms) >= 10 and len(missing_api) + len(api_cases) >= 35  # the lists were found, not empty


def _our_commands() -> set[str]:
    """Every management command of the control plane's apps (``claimctl NAME`` or ``claimctl manage NAME``)."""
    ours = {"claims", "rollout", "oncall", "gateway"}
    return {name for name, app in get_commands().items() if app in ours} | set(MANAGEMENT.values()) - {
        "migrate",
        "check",
    }


def _braced(route: str) -> str:
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)


def _console_patterns() -> list[URLPattern]:
    from controlplane.console_urls import urlpatterns

    return [p for p in urlpatterns if isinstance(p, URLPattern)]


def _scene_stub() -> SimpleNamespace:
    return SimpleNamespace(ns="x", agent=SimpleNamespace(token="t" * 20, name="a"))


# --- the scene and its fingerprint -------------------------------------------------------------------------------

PEOPLE = {
    "worker": "agent-d",
    "viewer": "vic-viewer",
    "reviewer": "rita-reviewer",
    "operator": "olivia-operator",
    "oncall": "oscar-oncall",
}


def _scene(action: Action) -> SimpleNamespace:
    actors = {
        role: make_actor(name, role, "v1" if role == "worker" else "")
        for role, name in PEOPLE.items()
        if role != "viewer"  # the console's read-only group; the API's least role is a worker
    }
    s = SimpleNamespace(
        ns="doors",
        actors=actors,
        agent=actors["worker"],
        resource="res-1",
        server="srv",
        new_server="srv2",
        tool="lookup",
    )
    operator = actors["operator"]
    assert operator.post("/namespaces", {"name": "doors", "stage": action.stage}).status_code == 201
    s.task_legacy = operator.create(namespace="doors").json()["task_id"]
    s.mismatch = Mismatch.objects.create(
        namespace="doors", task_id=s.task_legacy, operation="complete", api="legacy", legacy={}, v1={},
        reason="STALE_COMMIT_ACCEPTED", at=Namespace.objects.get(name="doors").created_at,
    ).pk  # fmt: skip
    s.task_ready = operator.create(node_id="ready").json()["task_id"]
    s.task_claimed = operator.create(node_id="claimed").json()["task_id"]
    s.claim = s.agent.claim(s.task_claimed).json()
    s.effect_unknown = s.agent.prepare(s.claim, "s0", {"n": 0}).json()["effect_id"]
    assert s.agent.outcome(s.claim, s.effect_unknown, "UNKNOWN").status_code == 200
    s.effect_prepared = s.agent.prepare(s.claim, "s1", {"n": 1}).json()["effect_id"]
    risky = operator.create(node_id="migrate-db", replay_policy="NON_REPLAYABLE").json()["task_id"]
    risky_claim = s.agent.claim(risky).json()
    s.effect_approve = s.agent.prepare(risky_claim, "migrate", {"to": "v2"}).json()["effect_id"]
    created = operator.post("/resources", {"resource_key": "res-1"})
    assert created.status_code == 201, created.content
    s.incarnation = created.json()["incarnation"]
    downstream_save(
        principal=Principal.objects.get(name="olivia-operator"),
        name="srv",
        prefix="srv",
        transport="http",
        command=[],
        env={},
        url="http://127.0.0.1:9/mcp",
        call_timeout_seconds=5.0,
        trust_annotations=False,
        enabled=True,
    )
    stages.evaluate_gate(namespace="doors")  # the gate-check job's record: the page shows its checklist
    if "paused" in action.scene:
        epoch_fence(principal=Principal.objects.get(name="oscar-oncall"), namespace="doors", reason="scene")
    return s


SKIP_TABLES = {
    # Counters of requests and the sign-in session: every request counts, a refused one too.
    "claims.MetricTally", "claims.MinuteTally", "claims.MetricFold", "sessions.Session", "auth.User",
}  # fmt: skip


def _fingerprint() -> dict[str, list]:
    rows = {}
    for model in apps.get_models():
        if model._meta.label not in SKIP_TABLES:
            rows[model._meta.label] = sorted(map(repr, model.objects.order_by().values_list()))
    return rows


# --- the doors ---------------------------------------------------------------------------------------------------


def _fill(template: str, s: SimpleNamespace) -> str:
    return template.format(**{k: v for k, v in vars(s).items() if isinstance(v, str | int)})


def _api(action: Action, s: SimpleNamespace, role: str, body: dict[str, Any]):
    method, path = action.api  # type: ignore[misc]
    client = s.actors["worker" if role == "viewer" else role].client
    return getattr(client, method)(_fill(path, s), body, format="json")


def _console(action: Action, s: SimpleNamespace, client: Any, form: dict[str, Any]):
    return client.post(_fill(action.console, s), {k: v for k, v in form.items() if v is not None})  # type: ignore[arg-type]


def _cli(action: Action, s: SimpleNamespace, role: str, body: dict[str, Any]) -> str:
    argv = action.cli(s, body, PEOPLE[role])  # type: ignore[misc]
    with pytest.raises(CommandError) as refused:
        call_command(*argv)
    return str(refused.value)


def _variants(action: Action, door: str) -> list[tuple[str, str, Any]]:
    """(kind, field, value): what is wrong with the request."""
    found: list[tuple[str, str, Any]] = []
    for name in action.text:
        found += [("blank", name, ""), ("blank", name, "   \t")]
    for name in (*action.text, *action.required):
        if door != "cli" or action.cli_missing:
            found.append(("missing", name, None))
    if action.may_not != "nobody":
        found.append(("role", "", None))
    if action.wrong_stage is not None:
        found.append(("stage", "", None))
    return found


CASES = [
    pytest.param(
        name, door, kind, name_, value, id=f"{name}-{door}-{kind}-{name_}-{'ws' if value else value!r}"
    )
    for name, action in ACTIONS.items()
    for door in ("api", "console", "cli")
    if getattr(action, door) is not None
    for kind, name_, value in _variants(action, door)
]


@pytest.mark.parametrize(("name", "door", "kind", "field_name", "value"), CASES)
def test_the_same_bad_request_is_refused_at_every_door_with_nothing_written(
    name, door, kind, field_name, value
):
    action = ACTIONS[name]
    s = _scene(action)
    source = action.form if door == "console" and action.form else action.body
    body = dict(source(s))
    role = action.may
    if kind == "blank":
        body[field_name] = value
    elif kind == "missing":
        body.pop(field_name, None)
        if door == "cli":
            body[field_name] = None
    elif kind == "role":
        role = action.may_not
    elif kind == "stage":
        body |= action.wrong_stage or {}
    if door == "console" and kind == "missing":
        body[field_name] = None
    signed_in = login(role) if door == "console" else None  # signing in makes the user's principal: before
    before, audited = _fingerprint(), AuditEntry.objects.count()

    if door == "api":
        answer = _api(action, s, role, body)
        expected = {"blank": action.blank_status, "missing": (400,), "role": (403,), "stage": (409,)}[kind]
        assert answer.status_code in expected, (answer.status_code, answer.content)
        if kind in ("blank", "missing") and answer.status_code == 400:
            assert field_name in str(answer.json().get("errors", {})), answer.json()
        if kind == "stage":
            assert answer.json()["outcome"] == action.wrong_stage_word
    elif door == "console":
        answer = _console(action, s, signed_in, body)
        if kind == "role":
            assert answer.status_code == 403
        elif kind == "stage":
            shown = login_page(answer, role)
            assert action.wrong_stage_word in shown, shown[:2000]
        else:
            assert answer.status_code == 400, (answer.status_code, answer.get("Location"))
            page = answer.content.decode()
            said = re.search(
                rf'<p class="field-error" id="([\w-]*-{field_name.replace("_", "-")}-error)">', page
            )
            assert said, "no error beside the field"
            posted = _fill(action.console, s)  # type: ignore[arg-type]
            forms = "".join(re.findall(rf'<form\b[^>]*action="{re.escape(posted)}".*?</form>', page, re.S))
            shown = [
                tag
                for tag in re.findall(rf'<(?:input|textarea|select)\b[^>]*name="{field_name}"[^>]*>', forms)
                if 'type="hidden"' not in tag
            ]
            if (
                shown
            ):  # a visible field: the one of the refused form is marked invalid and described by the error
                assert any(
                    f'aria-invalid="true" aria-describedby="{said.group(1)}"' in tag for tag in shown
                ), shown
    else:
        said = _cli(action, s, role, body)
        expected_words = {
            "blank": [field_name],
            "missing": [field_name.replace("_", "-"), "--to" if field_name == "to_stage" else field_name],
            "role": [action.may],
            "stage": [action.wrong_stage_word],
        }[kind]
        assert any(word in said for word in expected_words), said

    assert _fingerprint() == before, "a refused request wrote something"
    assert AuditEntry.objects.count() == audited


def login_page(answer: Any, role: str) -> str:
    """What the console said about a refused action: the page the refusal leads to, with its messages."""
    if answer.status_code in (301, 302):
        return answer.client.get(answer["Location"]).content.decode()
    return answer.content.decode()
