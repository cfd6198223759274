"""Who sent a request with `Authorization: Bearer <token>`.

The one place where every token-authenticated endpoint (the HTTP API, the OpenAI and Ollama
APIs, the MCP server) reads the header, checks the token (knowledge.services.api_tokens: revocation,
expiry, last use), its scope and the caller's API rate limit, so all of them hold the same rules.
"""

from dataclasses import dataclass

from asgiref.sync import sync_to_async

from knowledge.models import ApiToken
from knowledge.services.api_tokens import api_token_authenticate
from knowledge.services.ratelimits import RateLimited, rate_limit_check

NO_TOKEN = "Send an API token as 'Authorization: Bearer <token>' (python manage.py create_api_token)."  # noqa: S105 - a message, not a secret
MALFORMED = "Send the API token as 'Authorization: Bearer <token>'."
INVALID = "This API token is not valid (revoked, expired, mistyped, or its user is inactive)."
# What each scope is needed for, as a refusal says it.
NEEDS = {
    ApiToken.Scope.READ: "reading",
    ApiToken.Scope.ASK: "asking questions",
    ApiToken.Scope.WRITE: "uploading or deleting documents",
}
# What a 401 carries, so clients know which scheme to retry with.
CHALLENGE = 'Bearer realm="api"'


@dataclass(frozen=True)
class Bearer:
    """The token's user, or why there is none: a message for the caller, the HTTP status to send
    it with, and for 429 when to try again."""

    user: object = None
    token: ApiToken | None = None
    error: str = ""
    status: int = 401
    retry_after: int | None = None


def out_of_scope(token: ApiToken, scope: str) -> str:
    return f"This API token's scope ({token.scope}) does not allow {NEEDS[scope]}; that needs a {scope!r} token."


def bearer_user(header: str, *, scope: str, ip: str | None = None) -> Bearer:
    """The user of the `Authorization` header's bearer token if its scope allows `scope`, counted
    against its rate limit. Every door names the scope of what it does (docs/clients.md)."""
    if not header:
        return Bearer(error=NO_TOKEN)
    scheme, _, secret = header.partition(" ")
    if scheme.casefold() != "bearer" or not secret.strip():
        return Bearer(error=MALFORMED)
    token = api_token_authenticate(secret.strip(), ip=ip)
    if token is None:
        return Bearer(error=INVALID)
    if not token.allows(scope):
        return Bearer(error=out_of_scope(token, scope), status=403)
    try:
        rate_limit_check(limit="RATE_LIMIT_API", user=token.user, token=token)
    except RateLimited as limited:
        return Bearer(error=str(limited), status=429, retry_after=limited.retry_after)
    return Bearer(user=token.user, token=token)


async def abearer_user(header: str, *, scope: str, ip: str | None = None) -> Bearer:
    return await sync_to_async(bearer_user)(header, scope=scope, ip=ip)
