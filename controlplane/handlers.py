"""JSON answers for the URL resolver's own errors (404, 400, 500), shared by both URL configurations."""

from __future__ import annotations

from django.http import JsonResponse


def not_found(request, exception=None):
    return JsonResponse({"outcome": "NOT_FOUND", "detail": "no such endpoint"}, status=404)


def server_error(request):
    return JsonResponse({"outcome": "ERROR", "detail": "internal error"}, status=500)


def bad_request(request, exception=None):
    return JsonResponse({"outcome": "INVALID", "errors": {"body": ["bad request"]}}, status=400)
