"""People, in a real browser against daphne: an invitation followed to a password and a
workspace; single sign-on through a real OpenID Provider and out again; feedback given in the
chat and through the API, read on the analytics page at a phone's width."""

import json
import re
from datetime import timedelta

import httpx
import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from playwright.sync_api import expect

from knowledge.models import Feedback, Invitation, Role
from knowledge.services.api_tokens import api_token_create
from knowledge.services.ingestion import document_create, document_ingest
from knowledge.services.invitations import invitation_create, invitation_link
from tests.browser.conftest import ARTIFACTS, axe_violations, console_errors, log_in
from tests.factories import make_user, make_workspace
from tests.oidc import CLIENT_ID, CLIENT_SECRET, PASSWORD, openid_provider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _serious(page, name):
    violations = axe_violations(page, name)
    assert violations == [], json.dumps(violations, indent=2)


def test_an_invited_person_sets_a_password_and_lands_in_the_workspace_as_a_viewer(daphne_server, browser_page):
    owner = make_user("owner", password="owner-pass-1")
    workspace = make_workspace(slug="acme", name="Acme", members={owner: Role.OWNER})
    page = browser_page
    errors = console_errors(page)
    log_in(page, daphne_server, "owner", "owner-pass-1")

    page.goto(f"{daphne_server}{reverse('knowledge:members', args=['acme'])}")
    page.fill("#id_email", "new.viewer@example.org")
    page.select_option("#id_role", "viewer")
    page.get_by_role("button", name="Invite", exact=True).click()
    link = page.locator("input.invitation-link[data-shown]").input_value()
    _serious(page, "members")
    page.screenshot(path=str(ARTIFACTS / "members-invitations.png"), full_page=True)
    page.click("text=Log out")

    page.goto(link)
    expect(page.locator("h1")).to_have_text("Join Acme")
    _serious(page, "invitation")
    page.fill("input[name=username]", "newviewer")
    page.fill("input[name=first_name]", "Nia")
    page.fill("input[name=password1]", "a-long-passphrase-42")
    page.fill("input[name=password2]", "a-long-passphrase-42")
    page.click("text=Make my account and join")

    page.wait_for_url(f"{daphne_server}{reverse('knowledge:workspace', args=['acme'])}")
    expect(page.locator(".tabs .role")).to_have_text("you are viewer")
    expect(page.locator(".account a").first).to_have_text("newviewer")
    assert errors == []

    # Used once: the same link now says so, signed out or not.
    page.click("text=Log out")
    page.goto(link)
    expect(page.locator(".invitation-error")).to_contain_text("already used")

    expired = invitation_create(
        workspace=workspace, actor=owner, email="late@example.org", role="viewer", base_url=f"{daphne_server}/"
    )
    Invitation.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    expired.refresh_from_db()
    page.goto(invitation_link(expired, base_url=daphne_server))
    expect(page.locator(".invitation-error")).to_contain_text("expired")
    page.screenshot(path=str(ARTIFACTS / "invitation-expired.png"))


@pytest.fixture
def sso_server(tmp_path, monkeypatch, request):
    """daphne with single sign-on through a test OpenID Provider, which also logs people out."""
    # A loopback redirect URI matches any port (RFC 8252), so the provider can start before daphne.
    with openid_provider(tmp_path, "http://127.0.0.1/login/sso/callback/") as provider:
        monkeypatch.setenv("OIDC_DISCOVERY_URL", provider.discovery_url)
        monkeypatch.setenv("OIDC_CLIENT_ID", CLIENT_ID)
        monkeypatch.setenv("OIDC_CLIENT_SECRET", CLIENT_SECRET)
        monkeypatch.setenv("OIDC_PROVIDER_NAME", "Corp SSO")
        monkeypatch.setenv("OIDC_GROUP_ROLES", "acme-editors=acme:editor")
        monkeypatch.setenv("OIDC_LOGOUT_FROM_PROVIDER", "true")
        make_workspace(slug="acme", name="Acme", members={make_user("owner"): Role.OWNER})
        yield request.getfixturevalue("daphne_server"), provider


def _sign_in_at_provider(page, *, allow=True):
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("text=Sign in to the provider")
    expect(page.locator("#authorizationForm")).to_be_visible()
    page.click("input[name=allow]" if allow else "input[value=Cancel]")


def test_a_person_signs_in_through_the_identity_provider_and_out_again(sso_server, browser_page):
    server, provider = sso_server
    page = browser_page

    page.goto(f"{server}/login/")
    _serious(page, "login-sso")
    page.click("text=Continue with Corp SSO")
    page.wait_for_url(re.compile(re.escape(provider.url)))
    _sign_in_at_provider(page)

    page.wait_for_url(f"{server}/")
    expect(page.locator(".account a").first).to_have_text("alice")
    page.goto(f"{server}{reverse('knowledge:workspace', args=['acme'])}")
    expect(page.locator(".tabs .role")).to_have_text("you are editor")
    page.goto(f"{server}{reverse('account')}")
    expect(page.locator("text=You signed in with Corp SSO.")).to_be_visible()

    page.click("text=Log out")
    page.wait_for_url(f"{server}/login/")
    assert page.context.cookies(server) == [] or all(c["name"] != "sessionid" for c in page.context.cookies(server))
    # Logged out of the provider too: signing in again asks for the password again.
    page.click("text=Continue with Corp SSO")
    expect(page.locator("input[name=password]")).to_be_visible()
    assert page.url.startswith(provider.url)


def test_declining_at_the_provider_ends_on_a_page_that_says_so(sso_server, browser_page):
    server, _ = sso_server
    page = browser_page

    page.goto(f"{server}/login/sso/")
    _sign_in_at_provider(page, allow=False)

    expect(page.locator(".sso-refusal")).to_contain_text("did not sign you in (access_denied)")
    _serious(page, "sso-refused")


HANDBOOK = """Ada Lovelace worked with Charles Babbage on the Analytical Engine in London.

Ada Lovelace wrote the first published algorithm for the Analytical Engine in 1843. Charles Babbage designed
the mill and the store of the Analytical Engine.
"""


@pytest.fixture
def team(transactional_db):
    """An owner and a viewer of a workspace with one document ingested by the default pipeline."""
    owner = make_user("owner", password="owner-pass-1")
    reader = make_user("reader", password="reader-pass-1")
    workspace = make_workspace(slug="acme", name="Acme", members={owner: Role.OWNER, reader: Role.VIEWER})
    with override_settings(LLM_BASE_URL="", LLM_API_KEY=""):
        document = document_create(
            workspace=workspace, user=reader, filename="handbook.txt", text=HANDBOOK, title="Handbook", enqueue=False
        )
        document_ingest(document_id=document.pk)
    return {"token": api_token_create(user=reader, name="laptop")[1]}


def test_feedback_from_the_chat_and_the_api_shows_on_the_analytics_page(team, daphne_server, browser_page):
    page = browser_page
    errors = console_errors(page)
    log_in(page, daphne_server, "reader", "reader-pass-1")
    page.goto(f"{daphne_server}{reverse('chat:new', args=['acme'])}")
    page.wait_for_function("() => document.getElementById('chat-status').textContent === 'Ready.'")
    page.fill("#ask-question", "Who designed the mill of the Analytical Engine?")
    page.keyboard.press("Enter")

    feedback = page.locator(".message-assistant .answer-feedback")
    expect(feedback).to_be_visible(timeout=60_000)
    feedback.get_by_role("button", name="No", exact=True).click()
    comment = feedback.locator("textarea[name=comment]")
    expect(comment).to_be_visible()
    comment.fill("It should name the engine's store too.")
    page.locator(".message-assistant .answer-feedback .feedback-save").click()
    expect(page.locator(".message-assistant .feedback-saved")).to_contain_text("with your comment")
    page.reload()
    expect(page.locator(".message-assistant .feedback-down")).to_have_attribute("aria-pressed", "true")
    _serious(page, "chat-feedback")

    headers = {"Authorization": f"Bearer {team['token']}"}
    asked = httpx.post(
        f"{daphne_server}/api/workspaces/acme/query",
        json={"question": "When did Ada Lovelace write the algorithm?", "mode": "naive"},
        headers=headers,
        timeout=60,
    ).json()
    rated = httpx.post(
        f"{daphne_server}/api/workspaces/acme/answers/{asked['answer_id']}/feedback",
        json={"rating": "down", "comment": "Say the year first."},
        headers=headers,
        timeout=10,
    )
    assert rated.status_code == 200
    assert Feedback.objects.count() == 2

    page.click("text=Log out")
    log_in(page, daphne_server, "owner", "owner-pass-1")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{daphne_server}{reverse('knowledge:analytics', args=['acme'])}")

    expect(page.locator('[data-figure="questions"]')).to_have_text("2")
    expect(page.locator('[data-figure="feedback"]')).to_have_text("0 / 2")
    unanswered = page.locator(".unanswered")
    expect(unanswered).to_contain_text("Who designed the mill of the Analytical Engine?")
    expect(unanswered).to_contain_text("It should name the engine's store too.")
    expect(unanswered).to_contain_text("Say the year first.")
    assert page.locator(".chart svg").count() == 4
    wide = page.evaluate(
        """() => [...document.querySelectorAll('body *')]
            .filter(el => el.getBoundingClientRect().right > window.innerWidth + 1 && !el.closest('.table-scroll'))
            .map(el => el.tagName + '.' + el.className + ' ' + Math.round(el.getBoundingClientRect().right))"""
    )
    assert wide == []
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    _serious(page, "analytics")
    page.screenshot(path=str(ARTIFACTS / "analytics-phone.png"), full_page=True)

    unanswered.locator("a", has_text="Who designed the mill").click()
    expect(page.locator(".review")).to_contain_text("Who designed the mill of the Analytical Engine?")
    _serious(page, "analytics-answer")
    assert errors == []
