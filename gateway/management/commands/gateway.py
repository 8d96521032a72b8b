"""``claimctl gateway …``: the MCP gateway's servers and tool rules as code, through the same validation and services
as the REST API (and the console), each change audited with ``--as``.

    claimctl gateway list                                   every server and rule, as JSON (environment values left out)
    claimctl gateway apply FILE --as NAME                   a JSON file {"downstreams": [...], "rules": [...]}: all or nothing
    claimctl gateway set-downstream NAME --as NAME [--url URL | --command ARG ...] [--prefix P] [--timeout S]
                                    [--trust-annotations] [--disable]
    claimctl gateway set-rule SERVER TOOL --as NAME [--kind K] [--slot-from S] [--slot-argument A]
                                    [--query-tool T] [--query-arguments JSON] [--occurred-if O] [--occurred-text X]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from rest_framework.exceptions import ValidationError

from claims.errors import ClaimError
from claims.management.commands._common import fail, principal, show
from claims.models import Role
from gateway import selectors, services
from gateway import serializers as s


def _valid(serializer_class: type, data: Any) -> dict[str, Any]:
    try:
        return dict(serializer_class().run_validation(data))
    except ValidationError as exc:
        raise CommandError(json.dumps({"outcome": "INVALID", "errors": exc.detail}, default=str)) from None


def _json(raw: str, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise CommandError(f"{what}: not JSON ({exc})") from None


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list")
        apply = sub.add_parser("apply")
        apply.add_argument("file")
        apply.add_argument("--as", dest="principal", required=True)
        server = sub.add_parser("set-downstream")
        server.add_argument("name")
        server.add_argument("--as", dest="principal", required=True)
        server.add_argument("--url")
        server.add_argument("--command", nargs="+", dest="argv")
        server.add_argument("--prefix")
        server.add_argument("--env", help='a JSON object, e.g. {"TOKEN": "…"}')
        server.add_argument("--timeout", type=float)
        server.add_argument("--trust-annotations", action="store_true", default=None)
        server.add_argument("--disable", action="store_true")
        rule = sub.add_parser("set-rule")
        rule.add_argument("downstream")
        rule.add_argument("tool")
        rule.add_argument("--as", dest="principal", required=True)
        for flag in ("kind", "slot-from", "slot-argument", "query-tool", "occurred-if", "occurred-text"):
            rule.add_argument(f"--{flag}")
        rule.add_argument("--query-arguments", help="a JSON object")
        rule.add_argument("--record-reads", action="store_true", default=None)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "list":
            show(self.stdout, selectors.configuration())
            return
        who = principal(options["principal"])
        if who.role not in (Role.OPERATOR, Role.ONCALL):
            raise CommandError(
                f"--as {who.name}: an operator's or on-call's change (this one is a {who.role})"
            )
        try:
            if action == "apply":
                path = Path(options["file"])
                if not path.is_file():
                    raise CommandError(f"no file {path}")
                config = _valid(s.ConfigIn, _json(path.read_text(), str(path)))
                saved = services.gateway_apply(principal=who, **config)
                self.stdout.write(
                    f"applied {saved} entries ({len(config['downstreams'])} servers, {len(config['rules'])} rules)"
                )
            elif action == "set-downstream":
                self._set_downstream(who, options)
            else:
                self._set_rule(who, options)
        except ClaimError as exc:
            raise fail(exc) from None

    def _set_downstream(self, who: Any, options: dict[str, Any]) -> None:
        given: dict[str, Any] = {
            "url": options["url"],
            "command": options["argv"],
            "prefix": options["prefix"],
            "env": _json(options["env"], "--env") if options["env"] else None,
            "call_timeout_seconds": options["timeout"],
            "trust_annotations": options["trust_annotations"],
            "enabled": False if options["disable"] else None,
        }
        data = _valid(s.DownstreamIn, {k: v for k, v in given.items() if v is not None})
        name = options["name"]
        services.downstream_save(principal=who, name=name, **services.downstream_values(name, data))
        self.stdout.write(f"saved server {name}")

    def _set_rule(self, who: Any, options: dict[str, Any]) -> None:
        given = {
            key.replace("-", "_"): options[key.replace("-", "_")]
            for key in (
                "kind",
                "slot-from",
                "slot-argument",
                "query-tool",
                "occurred-if",
                "occurred-text",
                "record-reads",
            )
        }
        if options["query_arguments"]:
            given["query_arguments"] = _json(options["query_arguments"], "--query-arguments")
        data = _valid(s.ToolRuleIn, {k: v for k, v in given.items() if v is not None})
        services.tool_rule_set(principal=who, downstream=options["downstream"], tool=options["tool"], **data)
        self.stdout.write(f"saved the rule of {options['downstream']}/{options['tool']}")
