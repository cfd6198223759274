"""Absolute links the product hands out (invitation and sign-up emails, the sources of answers
given over the API): on PUBLIC_BASE_URL when the operator set one, else on the host the request
came to. Behind a proxy or a container network that host (`web:8000`, `host.docker.internal`) is
one a person's browser cannot open, which is why the setting wins."""

from django.conf import settings


def absolute(base_url: str, path: str) -> str:
    """`path` (starting with "/") on the public base URL, or on `base_url` without one."""
    return f"{(settings.PUBLIC_BASE_URL or base_url).rstrip('/')}{path}"
