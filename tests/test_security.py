"""Production settings, security headers and the pages a refusal shows (issue 16, points 1 and 6)."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.urls import reverse

from knowledge.models import Role
from tests.factories import make_user, make_workspace

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": "a-production-secret-key-that-is-long-and-random-9f8e7d6c5b4a3f2e1d0c",
    "ALLOWED_HOSTS": "rag.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://rag.example.com",
    "BEHIND_PROXY": "true",
    "DATABASE_URL": "postgres://graphrag:secret@db.invalid:5432/graphrag",
}


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {name: value for name, value in os.environ.items() if name not in {"HTTPS", "DEBUG"}}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**environment, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_passes_check_deploy_with_production_variables():
    result = _manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert result.stdout.strip() == "System check identified no issues (0 silenced)."


def test_it_warns_in_check_deploy_when_https_is_turned_off():
    result = _manage("check", "--deploy", **{**PRODUCTION, "HTTPS": "false"})

    assert "security.W008" in result.stderr
    assert "security.W012" in result.stderr


def _setting(name: str, **env: str) -> str:
    result = _manage("shell", "--no-imports", "-c", f"from django.conf import settings; print(settings.{name})", **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_it_defaults_to_https_with_debug_off_and_to_plain_http_with_debug_on():
    assert _setting("SECURE_SSL_REDIRECT", **PRODUCTION) == "True"
    assert _setting("SECURE_SSL_REDIRECT", **{**PRODUCTION, "DEBUG": "true"}) == "False"


def test_it_trusts_x_forwarded_proto_only_behind_a_declared_proxy():
    assert _setting("SECURE_PROXY_SSL_HEADER", **PRODUCTION) == "('HTTP_X_FORWARDED_PROTO', 'https')"
    assert _setting("SECURE_PROXY_SSL_HEADER", **{**PRODUCTION, "BEHIND_PROXY": "false"}) == "None"


def test_it_redirects_plain_http_to_https_and_sends_hsts_over_https(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 31_536_000

    assert client.get("/login/").status_code == 301
    response = client.get("/login/", secure=True)
    assert response.status_code == 200
    assert response["Strict-Transport-Security"].startswith("max-age=31536000")


def test_it_sends_a_content_security_policy_without_inline_scripts(client, db):
    response = client.get(reverse("login"))

    policy = response["Content-Security-Policy"]
    assert "script-src 'self';" in policy + ";"
    assert "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
    assert "frame-ancestors 'none'" in policy
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"


@pytest.fixture
def viewer_client(client, db):
    viewer = make_user("viewer")
    make_workspace(slug="acme", name="Acme", members={viewer: Role.VIEWER})
    client.force_login(viewer)
    return client


def test_it_shows_a_403_in_the_site_layout_and_logs_it_without_a_traceback(viewer_client, caplog):
    with caplog.at_level(logging.INFO):
        response = viewer_client.get(reverse("knowledge:settings", args=["acme"]))

    assert response.status_code == 403
    page = response.content.decode()
    assert "GraphRAG Teams" in page
    assert "You can't do that here" in page
    assert "This needs the owner role in Acme." in page
    forbidden = [record for record in caplog.records if record.name == "django.request"]
    assert [record.levelname for record in forbidden] == ["WARNING"]
    assert all(record.exc_info is None for record in caplog.records)
    assert "Traceback" not in caplog.text


def test_it_shows_a_404_in_the_site_layout_and_logs_it_without_a_traceback(viewer_client, caplog):
    with caplog.at_level(logging.INFO):
        response = viewer_client.get(reverse("knowledge:workspace", args=["someone-elses"]))

    assert response.status_code == 404
    assert "Nothing here" in response.content.decode()
    assert "GraphRAG Teams" in response.content.decode()
    assert "Traceback" not in caplog.text


def test_it_shows_a_500_page_without_the_error_and_logs_the_traceback(viewer_client, caplog, monkeypatch):
    from knowledge import selectors

    def broken(user):
        raise RuntimeError("postgres://admin:hunter2@db/secret is down")

    monkeypatch.setattr(selectors, "workspaces_for_user", broken)
    viewer_client.raise_request_exception = False
    with caplog.at_level(logging.ERROR):
        response = viewer_client.get(reverse("home"))

    assert response.status_code == 500
    page = response.content.decode()
    assert "Something went wrong" in page
    assert "hunter2" not in page
    assert "Traceback" not in page
    assert any(record.exc_info for record in caplog.records if record.name == "django.request")


def test_it_shows_a_failed_documents_detail_to_owners_only(client, db):
    from knowledge.models import Document
    from tests.factories import make_document

    owner, viewer = make_user("owner"), make_user("viewer")
    workspace = make_workspace(slug="acme", members={owner: Role.OWNER, viewer: Role.VIEWER})
    document = make_document(workspace, title="Report")
    Document.objects.filter(pk=document.pk).update(
        status="failed",
        error="The chat model refused the request; an owner should check LLM settings.",
        error_detail="The chat model at https://llm.internal/v1 refused the API key (401). Check LLM_API_KEY.",
    )
    pages = [reverse("knowledge:documents", args=["acme"]), reverse("knowledge:document", args=["acme", document.pk])]

    client.force_login(viewer)
    for url in pages:
        page = client.get(url).content.decode()
        assert "an owner should check LLM settings" in page
        assert "llm.internal" not in page
    client.force_login(owner)
    for url in pages:
        assert "https://llm.internal/v1 refused the API key" in client.get(url).content.decode()


def test_a_demoted_editor_loses_write_actions_on_the_next_request(client, db):
    from knowledge.models import Membership
    from knowledge.services.workspaces import membership_set_role

    owner, editor = make_user("owner"), make_user("editor")
    workspace = make_workspace(slug="acme", members={owner: Role.OWNER, editor: Role.EDITOR})
    client.force_login(editor)
    upload = reverse("knowledge:upload", args=["acme"])
    assert client.get(upload).status_code == 200

    membership_set_role(membership=Membership.objects.get(user=editor), actor=owner, role=Role.VIEWER)

    assert client.get(upload).status_code == 403
    assert client.post(upload, {"text": "New notes."}).status_code == 403
    assert "Upload" not in client.get(reverse("knowledge:documents", args=["acme"])).content.decode().split("<main")[1]
    assert workspace.documents.count() == 0
