"""The console's middleware, skipped for the REST API.

Every ``/api/`` call authenticates with a bearer token (``claims.auth``) and answers JSON: it has no session, no
cookie to protect from CSRF, no logged-in Django user and no flash messages. These subclasses of Django's own
middleware (so Django's checks still find them) hand an API request straight on and do their work for the
console, the login page and the admin only."""

from __future__ import annotations

from django.contrib.auth.middleware import AuthenticationMiddleware as _Authentication
from django.contrib.messages.middleware import MessageMiddleware as _Messages
from django.contrib.sessions.middleware import SessionMiddleware as _Sessions
from django.middleware.csrf import CsrfViewMiddleware as _Csrf

API_PREFIX = "/api/"


class _ConsoleOnly:
    get_response: object

    def __call__(self, request):
        if request.path_info.startswith(API_PREFIX):
            return self.get_response(request)  # type: ignore[operator]
        return super().__call__(request)  # type: ignore[misc]


class SessionMiddleware(_ConsoleOnly, _Sessions):
    pass


class AuthenticationMiddleware(_ConsoleOnly, _Authentication):
    pass


class MessageMiddleware(_ConsoleOnly, _Messages):
    pass


class CsrfViewMiddleware(_ConsoleOnly, _Csrf):
    def process_view(self, request, callback, callback_args, callback_kwargs):
        if request.path_info.startswith(API_PREFIX):
            return None
        return super().process_view(request, callback, callback_args, callback_kwargs)
