"""API tokens: bearer secrets shown once, stored only as their sha256.

Every API that takes a token authenticates it here, with `api_token_authenticate`, so expiry,
revocation, scope and the record of use are decided in one place for all of them.
"""

import hashlib
import secrets
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from knowledge.models import ApiToken

TOKEN_PREFIX = "grt_"  # noqa: S105 - a public marker that makes leaked tokens easy to spot, not a secret
SCOPE_READ = ApiToken.Scope.READ
SCOPE_ASK = ApiToken.Scope.ASK
SCOPE_WRITE = ApiToken.Scope.WRITE


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def api_token_create(
    *, user, name: str, scope: str = SCOPE_ASK, expires_in: timedelta | None = None
) -> tuple[ApiToken, str]:
    """A new token for the user; the secret is returned here and never again."""
    if scope not in ApiToken.Scope.values:
        raise ValueError(f"Unknown scope {scope!r}: use {' or '.join(ApiToken.Scope.values)}.")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name,
        token_hash=_digest(secret),
        scope=scope,
        expires_at=timezone.now() + expires_in if expires_in is not None else None,
    )
    return token, secret


def api_token_authenticate(secret: str, *, ip: str | None = None) -> ApiToken | None:
    """The live token for this secret (its `user` loaded), or None when it is unknown, revoked,
    expired, or its user is inactive. Checked on every request, so a revocation takes effect on
    the next one. Records when and from where the token was last used."""
    now = timezone.now()
    token = (
        ApiToken.objects.select_related("user")
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now), token_hash=_digest(secret), revoked_at__isnull=True)
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now, last_used_ip=ip)
    token.last_used_at, token.last_used_ip = now, ip
    return token


def user_for_api_token(secret: str, *, ip: str | None = None):
    """The active user owning this live secret, or None (api_token_authenticate, without the token)."""
    token = api_token_authenticate(secret, ip=ip)
    return token.user if token is not None else None


def api_token_revoke(*, token: ApiToken) -> None:
    """Refuse the token from the next request on; the row stays, to show when it was last used."""
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
