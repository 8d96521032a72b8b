"""The answers for the URL resolver's own errors (400, 403, 404, 500), shared by both URL configurations: JSON in the
contract's shape for the API, the metrics and the probes; a styled HTML page for the console, a browser's page.

The HTML page stands alone (no user, no session, no database): a 500 may come from the database itself."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from claims.ui import error_page as page

MACHINE_PATHS = ("/api/", "/metrics", "/healthz", "/readyz")


def wants_json(request: HttpRequest) -> bool:
    return request.path.startswith(MACHINE_PATHS)


def not_found(request, exception=None):
    if wants_json(request):
        return JsonResponse({"outcome": "NOT_FOUND", "detail": "no such endpoint"}, status=404)
    return page(404, "Not found", "There is no page at this address.")


def server_error(request):
    if wants_json(request):
        return JsonResponse({"outcome": "ERROR", "detail": "internal error"}, status=500)
    return page(500, "Something went wrong", "The console could not answer; the error is logged. Try again.")


def bad_request(request, exception=None):
    if wants_json(request):
        return JsonResponse({"outcome": "INVALID", "errors": {"body": ["bad request"]}}, status=400)
    return page(400, "Bad request", "The request could not be understood.")


def forbidden(request, exception=None):
    if wants_json(request):
        return JsonResponse({"outcome": "FORBIDDEN", "detail": "not allowed"}, status=403)
    return page(403, "Not allowed", "Your account may not see or do this.")
