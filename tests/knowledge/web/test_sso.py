"""Single sign-on against a real OpenID Provider started by the test (tests/oidc_provider), our side
driven through Django's test client: the code flow, accounts matched or made by verified email,
group roles, and every refusal on a page that says why."""

import time
from urllib.parse import parse_qs, urlparse

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.urls import reverse

from knowledge.models import AuditEvent, Membership, Role
from tests.factories import make_user, make_workspace
from tests.oidc import CLIENT_ID, CLIENT_SECRET, consent_at_provider, openid_provider

CALLBACK = "http://testserver/login/sso/callback/"


@pytest.fixture(scope="module")
def _provider(tmp_path_factory):
    # One provider for the module: it keeps nothing of a sign-in but the consent it asks every time.
    with openid_provider(tmp_path_factory.mktemp("op"), CALLBACK) as provider:
        yield provider


@pytest.fixture
def provider(_provider, settings, transactional_db):
    _point_at(settings, _provider)
    return _provider


def _point_at(settings, provider):
    settings.SSO_ENABLED = True
    settings.OIDC_DISCOVERY_URL = provider.discovery_url
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = CLIENT_ID, CLIENT_SECRET
    settings.OIDC_GROUP_ROLES = {"acme-editors": [("acme", "editor")]}
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, "knowledge.web.sso.ProviderBackend"]
    cache.clear()


def _sign_in(client, username="alice", *, next_url=""):
    start = client.get(reverse("sso_login") + (f"?next={next_url}" if next_url else ""))
    assert start.status_code == 302, start.content[:300]
    back = consent_at_provider(start.url, username=username)
    assert back.startswith(CALLBACK)
    return back, client.get(back.removeprefix("http://testserver"))


def test_it_makes_an_account_on_first_sign_in_with_the_roles_of_its_groups(client, provider):
    workspace = make_workspace(slug="acme", members={make_user("owner"): Role.OWNER})

    _, response = _sign_in(client)

    assert response.status_code == 302
    alice = get_user_model().objects.get(email="alice@corp.example")
    assert (alice.username, alice.first_name, alice.has_usable_password()) == ("alice", "Alice", False)
    assert Membership.objects.get(user=alice, workspace=workspace).role == Role.EDITOR
    assert AuditEvent.objects.filter(workspace=workspace, action="member.sso").exists()
    assert client.get(reverse("knowledge:workspace", args=["acme"])).status_code == 200


def test_it_signs_in_an_existing_account_by_its_verified_email_and_never_lowers_a_role(client, provider):
    existing = make_user("alice.l")
    existing.email = "Alice@corp.example"
    existing.save()
    workspace = make_workspace(slug="acme", members={existing: Role.OWNER})

    _sign_in(client)

    assert get_user_model().objects.filter(email__iexact="alice@corp.example").count() == 1
    assert int(client.session["_auth_user_id"]) == existing.pk
    assert Membership.objects.get(user=existing, workspace=workspace).role == Role.OWNER


def test_it_refuses_an_email_the_provider_did_not_verify(client, provider):
    _, response = _sign_in(client, username="mallory")

    assert response.status_code == 403
    assert "has not verified mallory@corp.example" in response.content.decode()
    assert "_auth_user_id" not in client.session
    assert not get_user_model().objects.filter(email="mallory@corp.example").exists()


def test_it_refuses_a_replayed_callback(client, provider):
    back, first = _sign_in(client)
    client.logout()

    again = client.get(back.removeprefix("http://testserver"))

    assert first.status_code == 302
    assert again.status_code == 403
    assert "already completed, or it was started in another browser" in again.content.decode()
    assert "_auth_user_id" not in client.session


def test_it_refuses_an_expired_state(client, provider, settings):
    start = client.get(reverse("sso_login"))
    back = consent_at_provider(start.url, username="alice")

    with time_machine.travel(time.time() + settings.OIDC_STATE_SECONDS + 5, tick=False):
        response = client.get(back.removeprefix("http://testserver"))

    assert response.status_code == 403
    assert "expired" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_it_refuses_a_state_it_never_issued(client, provider):
    back, _ = _sign_in(client)
    client.logout()
    query = parse_qs(urlparse(back).query)

    response = client.get(reverse("sso_callback"), {"code": query["code"][0], "state": "forged"})

    assert response.status_code == 403
    assert "_auth_user_id" not in client.session


def test_it_refuses_an_id_token_from_another_issuer(client, tmp_path, settings, transactional_db):
    with openid_provider(tmp_path, CALLBACK, token_issuer="https://impostor.example") as provider:
        _point_at(settings, provider)

        _, response = _sign_in(client)

    assert response.status_code == 403
    assert "https://impostor.example" in response.content.decode()
    assert "_auth_user_id" not in client.session
    assert not get_user_model().objects.filter(email="alice@corp.example").exists()


def test_it_says_so_when_the_person_declines_at_the_provider(client, provider):
    start = client.get(reverse("sso_login"))

    back = consent_at_provider(start.url, username="alice", allow=False)
    response = client.get(back.removeprefix("http://testserver"))

    assert response.status_code == 403
    assert "did not sign you in (access_denied)" in response.content.decode()


def test_it_refuses_new_people_when_accounts_are_not_made_at_sign_in(client, provider, settings):
    settings.OIDC_CREATE_USERS = False

    _, response = _sign_in(client)

    assert response.status_code == 403
    assert "Ask an owner of a workspace to invite you" in response.content.decode()


def test_an_invited_person_joins_through_single_sign_on(client, provider):
    from knowledge.services.invitations import invitation_create, invitation_link

    owner = make_user("owner")
    workspace = make_workspace(slug="docs", members={owner: Role.OWNER})
    invitation = invitation_create(
        workspace=workspace, actor=owner, email="alice@corp.example", role="viewer", base_url="http://testserver/"
    )
    link = invitation_link(invitation, base_url="http://testserver/").removeprefix("http://testserver")

    _, response = _sign_in(client, next_url=link)
    accepted = client.post(response.url)

    assert response.url == link
    assert accepted.status_code == 302
    assert Membership.objects.get(workspace=workspace, user__email="alice@corp.example").role == Role.VIEWER


def test_it_shows_a_page_when_the_provider_cannot_be_reached(client, db, settings):
    settings.SSO_ENABLED = True
    settings.OIDC_DISCOVERY_URL = "http://127.0.0.1:9/.well-known/openid-configuration"
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    cache.clear()

    response = client.get(reverse("sso_login"))

    assert response.status_code == 502
    assert "could not be reached" in response.content.decode()


def test_single_sign_on_sends_back_to_the_login_page_when_it_is_not_configured(client, db):
    for name in ("sso_login", "sso_callback"):
        response = client.get(reverse(name), follow=True)
        assert response.redirect_chain[-1][0] == reverse("login")
        assert "Single sign-on is not configured here" in response.content.decode()
