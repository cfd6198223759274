"""API paths answer errors as JSON, never as the site's HTML pages.

A client library or an MCP host shows an error body to its user: the HTML of a 404 page reads as
"rejected: <!doctype html>…". Django's own 404, 405 and 500 (no such path, a wrong method, an
exception) are the site's pages; this middleware, first in MIDDLEWARE, turns any such response
under an API path into the error shape of the door that path belongs to.

MCP hosts whose token is missing or mistyped try OAuth discovery (RFC 9728, RFC 8414, OpenID
discovery, dynamic client registration): those paths say, in OAuth's error shape which hosts show
as the reason, that this server takes API tokens and the one sent is not valid.
"""

from collections.abc import Callable
from http import HTTPStatus

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import sync_and_async_middleware

from knowledge.api import http, openai
from knowledge.api.auth import INVALID
from knowledge.api.responses import Door

OAUTH_PATHS = (
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-authorization-server",
    "/.well-known/openid-configuration",
)
REGISTER_PATH = "/register"
NO_OAUTH = (
    f"{INVALID} This server does not sign in with OAuth: send an API token as "
    "'Authorization: Bearer <token>' in the client's headers (python manage.py create_api_token)."
)
# Longest first: the first prefix a path starts with names its door.
API_DOORS: tuple[tuple[str, Door], ...] = (("/v1/", openai.DOOR), ("/api/", http.DOOR), ("/mcp", http.DOOR))
SERVER_FAILED = "The server failed on this request; try again, and tell its operator if it keeps failing."


def _door(path: str) -> Door | None:
    return next((door for prefix, door in API_DOORS if path.startswith(prefix)), None)


def _is_oauth(path: str) -> bool:
    return path.rstrip("/") == REGISTER_PATH or path.startswith(OAUTH_PATHS)


def _message(request: HttpRequest, response: HttpResponse) -> str:
    status = response.status_code
    if status == 404:
        return f"No such endpoint: {request.method} {request.path}."
    if status == 405:
        return f"{request.method} is not allowed on {request.path}; use {response.get('Allow', 'another method')}."
    if status >= 500:
        return SERVER_FAILED
    return f"{HTTPStatus(status).phrase}."


def json_error(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """`response` itself, unless it is an error page under an API path: then the JSON of its door."""
    answered = response.get("Content-Type", "").startswith("application/json")
    if response.status_code < 400 or response.streaming or answered:
        return response
    path = request.path
    if _is_oauth(path):
        return JsonResponse({"error": "invalid_token", "error_description": NO_OAUTH}, status=response.status_code)
    door = _door(path)
    if door is None:
        return response
    replaced = door.error(response.status_code, _message(request, response))
    if "Allow" in response:
        replaced["Allow"] = response["Allow"]
    return replaced


@sync_and_async_middleware
def json_errors(get_response: Callable):
    if iscoroutinefunction(get_response):

        async def middleware(request):
            return json_error(request, await get_response(request))

    else:

        def middleware(request):
            return json_error(request, get_response(request))

    return middleware
