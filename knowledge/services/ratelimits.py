"""Rate limits on asking, the API and uploads, and the backoff of locked-out logins.

Counted in Django's cache, which is Redis (settings.CACHES), so a limit holds across every web
process. A fixed window per key: one INCR per action, the key expiring with its window; the
first action of a window may come right after the last of the previous one, which is the price
of one round trip per action. django-ratelimit does the same for views only; the websocket's
questions need the counter without a request, hence this module.
"""

import logging
import math
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

MAX_LOCKOUT = timedelta(days=1)


@dataclass(frozen=True)
class RateLimited(Exception):
    """Too many of one action: try again in `retry_after` seconds."""

    action: str
    retry_after: int

    def __str__(self) -> str:
        return f"Too many {self.action} for now; try again in {_wait(self.retry_after)}."


def rate_limit_check(*, limit: str, user=None, token=None, address: str | None = None, count: int = 1) -> None:
    """Count `count` actions against the limit named by its setting (e.g. "RATE_LIMIT_ASK").

    An API token has its own budget (tokens are issued one per client); an action without a user
    (a sign-up) counts against its client address; anything else against the user's. Raises
    RateLimited when that budget is spent."""
    rate = getattr(settings, limit)
    if rate is None:
        return
    allowed, period = rate
    who = f"token:{token.pk}" if token is not None else f"ip:{address}" if user is None else f"user:{user.pk}"
    now = time.time()
    window = int(now // period)
    key = f"rate:{limit}:{who}:{window}"
    try:
        # add() sets the counter only when absent, so concurrent first actions do not reset it.
        cache.add(key, 0, timeout=period + 1)
        used = cache.incr(key, count)
    except RedisError:
        # A limit protects the service; it must not take asking down with Redis. Open, and say so.
        logger.warning("rate limit %s not counted: the cache is unreachable", limit, exc_info=True)
        return
    if used > allowed:
        raise RateLimited(action=_ACTIONS.get(limit, "requests"), retry_after=math.ceil((window + 1) * period - now))


_ACTIONS = {
    "RATE_LIMIT_API": "API requests",
    "RATE_LIMIT_ASK": "questions",
    "RATE_LIMIT_UPLOAD": "uploads",
    "RATE_LIMIT_INVITE": "invitation emails",
    "RATE_LIMIT_SIGNUP": "sign-up emails",
}


def _wait(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} seconds"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} minutes"
    return f"{seconds / 3600:.1f} hours"


def login_cool_off(request=None) -> timedelta:
    """How long a username and address pair stays locked out (settings.AXES_COOLOFF_TIME):
    LOGIN_LOCKOUT_MINUTES at the limit, doubled by every failure past it, at most a day."""
    base = timedelta(minutes=settings.LOGIN_LOCKOUT_MINUTES)
    if request is None:
        return base
    # Read directly: axes computes its failure count with this very cool-off, so asking axes would recurse.
    from axes.models import AccessAttempt

    failures = (
        AccessAttempt.objects.filter(
            username=request.POST.get("username", ""), ip_address=getattr(request, "axes_ip_address", None)
        )
        .values_list("failures_since_start", flat=True)
        .first()
    )
    past_limit = max(0, (failures or 0) - settings.LOGIN_FAILURE_LIMIT)
    return min(base * 2 ** min(past_limit, 20), MAX_LOCKOUT)
