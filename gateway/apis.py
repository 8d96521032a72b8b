"""The gateway's configuration as code: downstream servers and tool rules through the REST API — operators and
on-call change them (validated with field errors, audited with the principal, through the same services as the
console and ``claimctl gateway``) and read them; other roles get 403."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_view
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from claims.apis import AuthedRequest, operation, parsed
from claims.permissions import IsOperator

from . import selectors, services
from . import serializers as s


class _Config(APIView):
    permission_classes = [IsOperator]


class _ConfigRow(_Config):
    """PUT one row of the configuration: saved through its service (audited), answered as the configuration now
    reads it (``rows``: its list there; the URL's names pick the row)."""

    input: type[Serializer]
    rows: str

    def save(self, request: AuthedRequest, data: dict[str, Any], **named: str) -> None:
        raise NotImplementedError

    def put(self, request: AuthedRequest, **named: str) -> Response:
        self.save(request, parsed(self.input, request), **named)
        found = selectors.configuration()[self.rows]
        return Response(next(r for r in found if r["source"] == "api" and named.items() <= r.items()))


class DownstreamListApi(_Config):
    @operation("gateway_downstreams", s.DownstreamOut(many=True), (401, 403))
    def get(self, request: AuthedRequest) -> Response:
        return Response(selectors.configuration()["downstreams"])


@extend_schema_view(
    put=operation(
        "gateway_downstream_put",
        s.DownstreamOut,
        (400, 401, 403),
        request=s.DownstreamIn,
        description="Create or change the downstream MCP server `name` (audited). Its tools are exposed as "
        "`<prefix>__<tool>`. A server fixed in settings (MCP_DOWNSTREAMS) cannot be changed here (400).",
    )
)
class DownstreamApi(_ConfigRow):
    input, rows = s.DownstreamIn, "downstreams"

    def save(self, request: AuthedRequest, data: dict[str, Any], **named: str) -> None:
        name = named["name"]
        services.downstream_save(principal=request.user, name=name, **services.downstream_values(name, data))


class ToolRuleListApi(_Config):
    @operation("gateway_rules", s.ToolRuleOut(many=True), (401, 403))
    def get(self, request: AuthedRequest) -> Response:
        return Response(selectors.configuration()["rules"])


@extend_schema_view(
    put=operation(
        "gateway_rule_put",
        s.ToolRuleOut,
        (400, 401, 403),
        request=s.ToolRuleIn,
        description='Set how the gateway treats one tool of one server (audited); docs/mcp.md "Tool rules".',
    )
)
class ToolRuleApi(_ConfigRow):
    input, rows = s.ToolRuleIn, "rules"

    def save(self, request: AuthedRequest, data: dict[str, Any], **named: str) -> None:
        services.tool_rule_set(principal=request.user, **named, **data)
