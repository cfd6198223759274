"""Typed readers for environment variables that fail loudly, naming the variable."""

import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_url(name: str) -> str:
    """An absolute http(s) URL without a trailing slash, or empty when unset."""
    raw = env_str(name)
    if not raw:
        return ""
    scheme, _, rest = raw.partition("://")
    if scheme not in ("http", "https") or not rest.strip("/"):
        raise ImproperlyConfigured(f"{name} must be an http:// or https:// URL, got {raw!r}.")
    return raw.rstrip("/")


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}.")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}.")
    return value


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}.") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}.")
    return value


_PERIODS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def env_rate(name: str, default: str) -> tuple[int, int] | None:
    """A rate limit written "<count>/<second|minute|hour|day>" as (count, seconds); None for "off"."""
    raw = os.environ.get(name, default).strip().lower()
    if raw in {"off", "none", ""}:
        return None
    count, _, period = raw.partition("/")
    if not count.strip().isdigit() or int(count) < 1 or period.strip() not in _PERIODS:
        raise ImproperlyConfigured(
            f"{name} must look like 30/minute (per second, minute, hour or day) or off, got {raw!r}."
        )
    return int(count), _PERIODS[period.strip()]


def env_prices(name: str) -> dict[str, tuple[float, float]]:
    """Model prices written "model=input/output,..." in dollars per million tokens, e.g.
    "gpt-4o-mini=0.15/0.60"; {} when unset."""
    prices: dict[str, tuple[float, float]] = {}
    for item in env_list(name, []):
        model, _, price = item.rpartition("=")
        given, _, taken = price.partition("/")
        try:
            prices[model.strip()] = (float(given), float(taken))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name} must look like gpt-4o-mini=0.15/0.60,gpt-4o=2.50/10 (dollars per million input/output "
                f"tokens), got {item!r}."
            ) from None
        if not model.strip() or min(prices[model.strip()]) < 0:
            raise ImproperlyConfigured(f"{name}: {item!r} needs a model name and prices of zero or more.")
    return prices


def env_group_roles(name: str, roles: tuple[str, ...]) -> dict[str, list[tuple[str, str]]]:
    """Identity-provider groups mapped to workspace roles, written "group=workspace:role,...", e.g.
    "engineering=acme:editor,leads=acme:owner"; a group may appear more than once."""
    mapping: dict[str, list[tuple[str, str]]] = {}
    for item in env_list(name, []):
        group, _, target = item.rpartition("=")
        slug, _, role = target.partition(":")
        if not group.strip() or not slug.strip() or role.strip() not in roles:
            raise ImproperlyConfigured(
                f"{name} must look like engineering=acme:editor,leads=acme:owner (group=workspace:role, the role "
                f"one of {', '.join(roles)}), got {item!r}."
            )
        mapping.setdefault(group.strip(), []).append((slug.strip(), role.strip()))
    return mapping
