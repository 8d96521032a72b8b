from __future__ import annotations

from django.urls import path

from . import views

console_pages = [
    path("gateway/", views.gateway_page, name="gateway"),
    path("gateway/downstreams", views.downstream_save, name="gateway-downstream"),
    path("gateway/rules", views.tool_rule_set, name="gateway-rule"),
]
