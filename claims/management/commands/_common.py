from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from claims.errors import ClaimError
from claims.models import Principal


def principal(name: str) -> Principal:
    found = Principal.objects.filter(name=name).first()
    if found is None:
        raise CommandError(
            f"no principal {name!r}: create one with issue_token --role operator|oncall --name {name}"
        )
    return found


def fail(exc: ClaimError) -> CommandError:
    body = exc.body()
    return CommandError(json.dumps(body, default=str))


def show(stdout: Any, body: Any) -> None:
    stdout.write(json.dumps(body, indent=2, default=str))
