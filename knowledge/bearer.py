"""Who sent a request with `Authorization: Bearer <token>`.

The one place where every token-authenticated endpoint (the HTTP API, the OpenAI and Ollama
APIs, the MCP server) reads the header; whether the token is good is for
knowledge.api_tokens.user_for_api_token alone to say, so what it checks (revocation, expiry,
scope) applies to all of them.
"""

from dataclasses import dataclass

from asgiref.sync import sync_to_async

from knowledge.api_tokens import user_for_api_token

NO_TOKEN = "Send an API token as 'Authorization: Bearer <token>' (python manage.py create_api_token)."  # noqa: S105 - a message, not a secret
MALFORMED = "Send the API token as 'Authorization: Bearer <token>'."
INVALID = "This API token is not valid (revoked, mistyped, or its user is inactive)."
# What a 401 carries, so clients know which scheme to retry with.
CHALLENGE = 'Bearer realm="api"'


@dataclass(frozen=True)
class Bearer:
    """The token's user, or why there is none (a message for the caller)."""

    user: object = None
    error: str = ""


def bearer_user(header: str) -> Bearer:
    """The user of the `Authorization` header's bearer token."""
    if not header:
        return Bearer(error=NO_TOKEN)
    scheme, _, secret = header.partition(" ")
    if scheme.casefold() != "bearer" or not secret.strip():
        return Bearer(error=MALFORMED)
    user = user_for_api_token(secret.strip())
    return Bearer(user=user) if user is not None else Bearer(error=INVALID)


async def abearer_user(header: str) -> Bearer:
    return await sync_to_async(bearer_user)(header)
