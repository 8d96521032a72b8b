"""The gateway's configuration as code: downstream servers and tool rules through the REST API — operators and
on-call change them (validated with field errors, audited with the principal, through the same services as the
console and ``claimctl gateway``) and read them; other roles get 403."""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import APIView

from claims.apis import AuthedRequest, operation, parsed
from claims.permissions import IsOperator

from . import selectors, services
from . import serializers as s


class _Config(APIView):
    permission_classes = [IsOperator]


class DownstreamListApi(_Config):
    @operation("gateway_downstreams", s.DownstreamOut(many=True), (401, 403))
    def get(self, request: AuthedRequest) -> Response:
        return Response(selectors.configuration()["downstreams"])


class DownstreamApi(_Config):
    @operation(
        "gateway_downstream_put",
        s.DownstreamOut,
        (400, 401, 403),
        request=s.DownstreamIn,
        description="Create or change the downstream MCP server `name` (audited). Its tools are exposed as "
        "`<prefix>__<tool>`. A server fixed in settings (MCP_DOWNSTREAMS) cannot be changed here (400).",
    )
    def put(self, request: AuthedRequest, name: str) -> Response:
        data = parsed(s.DownstreamIn, request)
        services.downstream_save(principal=request.user, name=name, **services.downstream_values(name, data))
        return Response(
            next(
                d
                for d in selectors.configuration()["downstreams"]
                if d["name"] == name and d["source"] == "api"
            )
        )


class ToolRuleListApi(_Config):
    @operation("gateway_rules", s.ToolRuleOut(many=True), (401, 403))
    def get(self, request: AuthedRequest) -> Response:
        return Response(selectors.configuration()["rules"])


class ToolRuleApi(_Config):
    @operation(
        "gateway_rule_put",
        s.ToolRuleOut,
        (400, 401, 403),
        request=s.ToolRuleIn,
        description='Set how the gateway treats one tool of one server (audited); docs/mcp.md "Tool rules".',
    )
    def put(self, request: AuthedRequest, downstream: str, tool: str) -> Response:
        data = parsed(s.ToolRuleIn, request)
        services.tool_rule_set(principal=request.user, downstream=downstream, tool=tool, **data)
        found = selectors.configuration()["rules"]
        return Response(
            next(r for r in found if (r["downstream"], r["tool"], r["source"]) == (downstream, tool, "api"))
        )
