"""Roles (claim-v1.md §2): only workers claim; oncall may do all an operator may; every role may read."""

from __future__ import annotations

from rest_framework.permissions import BasePermission

from .models import Principal, Role


def _principal(request) -> Principal | None:
    user = getattr(request, "user", None)
    return user if isinstance(user, Principal) else None


class AnyRole(BasePermission):
    message = "a token is required"

    def has_permission(self, request, view) -> bool:
        return _principal(request) is not None


class _RoleIn(BasePermission):
    roles: frozenset[str] = frozenset()
    message = "your role may not do this"

    def has_permission(self, request, view) -> bool:
        principal = _principal(request)
        return principal is not None and principal.role in self.roles


class IsWorker(_RoleIn):
    roles = frozenset({Role.WORKER})
    message = "only workers may do this"


class IsOperator(_RoleIn):
    roles = frozenset({Role.OPERATOR, Role.ONCALL})
    message = "only operators (or oncall) may do this"


class IsReviewer(_RoleIn):
    """Reviewing shadow mismatches: reviewers, and operators and on-call, who may do all a reviewer may."""

    roles = frozenset({Role.REVIEWER, Role.OPERATOR, Role.ONCALL})
    message = "only reviewers, operators or oncall may do this"


class IsOncall(_RoleIn):
    roles = frozenset({Role.ONCALL})
    message = "only oncall may do this"


class IsTaskCreator(_RoleIn):
    roles = frozenset({Role.OPERATOR, Role.ONCALL, Role.WORKER})
    message = "only operators, or workers creating sub-tasks, may create tasks"
