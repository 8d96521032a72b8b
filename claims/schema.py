"""drf-spectacular: the bearer-token scheme, the refusal vocabulary as enums, and what every operation may answer.

The outcome and reason enums are computed when the schema is generated, from every ``Conflict`` subclass loaded and
the words registered (``claims.errors``): with the rollout app installed they include its words, without it they
do not — the core never names them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerFieldExtension

from . import errors


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "claims.auth.BearerTokenAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "`python manage.py issue_token --role worker|operator|oncall --name NAME`",
        }


class OutcomeWordSchema(OpenApiSerializerFieldExtension):
    target_class = "claims.serializers.OutcomeWordField"

    def map_serializer_field(self, auto_schema, direction):
        return {"$ref": "#/components/schemas/ConflictOutcome"}


class ReasonWordSchema(OpenApiSerializerFieldExtension):
    target_class = "claims.serializers.ReasonWordField"

    def map_serializer_field(self, auto_schema, direction):
        return {"$ref": "#/components/schemas/ConflictReason"}


_INT = {"type": "integer"}
_STR = {"type": "string"}


class CurrentSchema(OpenApiSerializerFieldExtension):
    target_class = "claims.serializers.CurrentField"

    def map_serializer_field(self, auto_schema, direction):
        return {
            "type": "object",
            "description": "The authoritative values after the refusal; which appear depends on it.",
            "properties": {
                "state": _STR,
                "state_version": _INT,
                "scheduler_epoch": _INT,
                "claim_generation": _INT,
                "cancel_generation": _INT,
                "input_digest": _STR,
                "claims_paused": {"type": "boolean"},
                "pause_hold": _STR,
                "stage": _STR,
                "min_protocol": _STR,
                "required": _STR,
                "protocol": _STR,
                "owner_id": {"type": "string", "nullable": True},
                "expires_at": {"type": "string", "format": "date-time", "nullable": True},
                "resource": {"type": "object", "additionalProperties": True},
                "gate": _STR,
                "figures": {"type": "object", "additionalProperties": True},
            },
            "additionalProperties": True,
        }


_PAGE_PARAMETERS = [
    {
        "name": "page",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1},
        "description": "Page number, from 1.",
    },
    {
        "name": "page_size",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 500},
        "description": "Items per page (default 100, at most 500).",
    },
]


def _exactly_one(schemas: dict[str, Any]) -> None:
    """Every ``oneOf`` of answers means exactly one: each member is closed (``additionalProperties: false`` — the
    server sends no field its schema does not name), and the most specific member (most required fields) comes
    first, for generated clients that try the members in order."""

    def component(ref: str) -> dict[str, Any]:
        return schemas.get(ref.rsplit("/", 1)[-1], {})

    for schema in schemas.values():
        members = schema.get("oneOf")
        if not members or not all("$ref" in m for m in members):
            continue
        for member in members:
            component(member["$ref"])["additionalProperties"] = False
        members.sort(key=lambda m: -len(component(m["$ref"]).get("required", [])))


def document_every_operation(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """What the views do not each say: every operation may answer 429 (the per-principal rate limit) and 503 (the
    database unreachable, nothing decided), both ``ErrorOut`` with ``Retry-After``; every ``*Page`` answer takes
    ``page`` and ``page_size``, and answers 404 for a page that does not exist."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["ConflictOutcome"] = {
        "type": "string",
        "enum": errors.conflict_outcomes(),
        "description": "Every 409 outcome word this server answers with.",
    }
    schemas["ConflictReason"] = {
        "type": "string",
        "enum": errors.conflict_reasons(),
        "description": "A 409's reason: an outcome word, or the finer cause (EPOCH, GENERATION, LEASE_LIVE, …).",
    }
    _exactly_one(schemas)
    error = {"$ref": "#/components/schemas/ErrorOut"}
    retry = {
        "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before sending again."}
    }
    for path in result.get("paths", {}).values():
        for method, operation in path.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            responses = operation.setdefault("responses", {})
            responses.setdefault(
                "429",
                {
                    "description": "THROTTLED: over this principal's request rate. Nothing changed.",
                    "headers": retry,
                    "content": {"application/json": {"schema": error}},
                },
            )
            responses.setdefault(
                "503",
                {
                    "description": "UNAVAILABLE: the database is unreachable; nothing was decided. Safe to retry.",
                    "headers": retry,
                    "content": {"application/json": {"schema": error}},
                },
            )
            ok = responses.get("200", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if ok.get("$ref", "").endswith("Page"):
                responses.setdefault(
                    "404",
                    {
                        "description": "NOT_FOUND: no such page (past the last one, or not a page number).",
                        "content": {"application/json": {"schema": error}},
                    },
                )
                names = {p.get("name") for p in operation.get("parameters", [])}
                operation.setdefault("parameters", []).extend(
                    p for p in _PAGE_PARAMETERS if p["name"] not in names
                )
    return result


LITERALS = ("outcome", "decided_by")


def literal_answers(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """An answer's ``outcome`` (and a routed answer's ``decided_by``) that is always one word is that word: an enum
    of one, required — the server always sends it. Typed clients can then narrow a union of answers on it (the
    TypeScript client: ``claim.outcome === "CLAIMED"``; ``"decided_by" in answer`` is legacy's decision)."""
    for schema in result.get("components", {}).get("schemas", {}).values():
        for name in LITERALS:
            field = schema.get("properties", {}).get(name)
            if field and field.get("type") == "string" and "default" in field and "enum" not in field:
                field["enum"] = [field["default"]]
                if name not in schema.get("required", []):
                    schema["required"] = sorted([*schema.get("required", []), name])
    return result
