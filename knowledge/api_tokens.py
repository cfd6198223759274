"""API tokens: bearer secrets shown once, stored only as their sha256."""

import hashlib
import secrets

from django.utils import timezone

from knowledge.models import ApiToken

TOKEN_PREFIX = "grt_"  # noqa: S105 - a public marker that makes leaked tokens easy to spot, not a secret


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def api_token_create(*, user, name: str) -> tuple[ApiToken, str]:
    """A new token for the user; the secret is returned here and never again."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, token_hash=_digest(secret))
    return token, secret


def user_for_api_token(secret: str):
    """The active user owning this secret, or None; records when the token was last used."""
    token = ApiToken.objects.select_related("user").filter(token_hash=_digest(secret)).first()
    if token is None or not token.user.is_active:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user
