from __future__ import annotations

import json
import sys
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


def confirmed(stdout: Any, *, consequence: str, answer: str, yes: bool) -> None:
    """A dangerous command's confirmation: its consequence said first; then ``--yes``, or ``answer`` typed at a
    terminal. Anything else is refused before anything is written."""
    stdout.write(consequence)
    if yes:
        return
    if sys.stdin.isatty():
        if input(f"Type {answer} to confirm: ").strip() == answer:
            return
        raise CommandError("not confirmed: nothing done")
    raise CommandError(f"{consequence} Not confirmed: pass --yes to confirm (nothing done).")
