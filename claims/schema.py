"""drf-spectacular: describe the bearer-token scheme in the OpenAPI schema."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "claims.auth.BearerTokenAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "`python manage.py issue_token --role worker|operator|oncall --name NAME`",
        }
