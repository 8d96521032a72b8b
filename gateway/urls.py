from __future__ import annotations

from django.urls import path

from . import apis, views

api_urlpatterns = [
    path("gateway/downstreams", apis.DownstreamListApi.as_view(), name="api-gateway-downstreams"),
    path("gateway/downstreams/<str:name>", apis.DownstreamApi.as_view(), name="api-gateway-downstream"),
    path("gateway/rules", apis.ToolRuleListApi.as_view(), name="api-gateway-rules"),
    path("gateway/rules/<str:downstream>/<str:tool>", apis.ToolRuleApi.as_view(), name="api-gateway-rule"),
]

console_pages = [
    path("gateway/", views.gateway_page, name="gateway"),
    path("gateway/downstreams", views.downstream_save, name="gateway-downstream"),
    path("gateway/rules", views.tool_rule_set, name="gateway-rule"),
]
