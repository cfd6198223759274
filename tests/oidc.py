"""A real OpenID Provider for the tests (tests/oidc_provider: django-oauth-toolkit in OIDC mode),
started as a process of its own, and the steps a person takes at it: sign in, then consent."""

import contextlib
import re
import sys
from html import unescape
from pathlib import Path
from urllib.parse import urljoin

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.processes import free_port, process_env, started, wait_for

CLIENT_ID = "graphrag-teams"
CLIENT_SECRET = "client-secret-for-tests"  # noqa: S105 - the test provider's, nowhere else
PASSWORD = "op-password"  # noqa: S105 - the test provider's people's


class Provider:
    def __init__(self, url: str):
        self.url = url
        self.issuer = f"{url}/o"
        self.discovery_url = f"{url}/o/.well-known/openid-configuration"


@contextlib.contextmanager
def openid_provider(tmp_path: Path, *redirect_uris: str, token_issuer: str = ""):
    """Start the provider on a free port, with our client allowed to come back to `redirect_uris`."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    port = free_port()
    env = process_env(
        OP_SECRET_KEY="op-secret-key-for-tests-only-" + "x" * 20,
        OP_DATABASE=str(tmp_path / f"op-{port}.sqlite3"),
        OP_RSA_KEY=pem.decode(),
        OP_TOKEN_ISSUER=token_issuer,
    )
    command = [sys.executable, "-m", "tests.oidc_provider.serve", str(port), CLIENT_ID, CLIENT_SECRET, *redirect_uris]
    with started("openid-provider", command, env) as process:
        provider = Provider(f"http://127.0.0.1:{port}")

        def serving():
            if process.process.poll() is not None:
                raise RuntimeError(f"the test OpenID Provider exited; see {process.log_path}")
            try:
                return requests.get(provider.discovery_url, timeout=2).ok
            except requests.RequestException:
                return False

        wait_for(serving, timeout=60, what="the OpenID Provider serving")
        yield provider


def _form(html: str) -> dict:
    fields = {}
    for tag in re.findall(r"<input[^>]*>", html):
        name = re.search(r'name="([^"]+)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if name and 'type="submit"' not in tag:
            fields[name.group(1)] = unescape(value.group(1)) if value else ""
    return fields


def consent_at_provider(authorize_url: str, *, username: str, allow: bool = True) -> str:
    """Sign in at the provider and answer its consent page, as a person would; returns the URL the
    provider sends the browser back to (our callback, with a code and the state)."""
    session = requests.Session()
    page = session.get(authorize_url, timeout=10)
    login = {**_form(page.text), "username": username, "password": PASSWORD}
    page = session.post(page.url, data=login, headers={"Referer": page.url}, timeout=10)
    consent = _form(page.text)
    assert "redirect_uri" in consent, f"no consent page: {page.text[:500]}"
    if allow:
        consent["allow"] = "Authorize"
    answer = session.post(page.url, data=consent, headers={"Referer": page.url}, allow_redirects=False, timeout=10)
    assert answer.status_code == 302, answer.text[:500]
    return urljoin(page.url, answer.headers["Location"])
