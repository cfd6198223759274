"""Bringing people in: invitations, sign-up links, logging in by email, the account page."""

import re
import threading
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from knowledge.models import AuditEvent, Invitation, Membership, Role
from knowledge.services import invitations
from knowledge.services.accounts import NewAccount
from tests.factories import make_user, make_workspace
from tests.processes import free_port

LINK = re.compile(r"http://testserver(/\S+)")


@pytest.fixture(autouse=True)
def _fast_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def owner_client(client, owner):
    client.force_login(owner)
    return client


def _invite(client, workspace, email="new.person@example.org", role="viewer"):
    return client.post(reverse("knowledge:invitation_create", args=[workspace.slug]), {"email": email, "role": role})


def _link_in_last_email() -> str:
    return LINK.search(mail.outbox[-1].body).group(1)


def _new_account(**fields):
    return {"username": "newperson", "first_name": "New", "last_name": "Person", **fields} | {
        "password1": fields.get("password1", "a-long-passphrase-42"),
        "password2": fields.get("password2", fields.get("password1", "a-long-passphrase-42")),
    }


def test_it_tells_an_owner_adding_an_unknown_name_to_invite_by_email(owner_client, workspace):
    response = owner_client.post(
        reverse("knowledge:member_add", args=[workspace.slug]), {"identifier": "viewer1", "role": "viewer"}
    )

    page = response.content.decode()
    assert response.status_code == 400
    assert "No user named &#x27;viewer1&#x27;" in page
    assert "invite them by email below" in page
    assert "Invite by email" in page


def test_it_emails_an_invitation_and_lists_it_with_its_link(owner_client, workspace, owner):
    response = _invite(owner_client, workspace, email="New.Person@Example.ORG", role="editor")

    assert response.status_code == 302
    invitation = Invitation.objects.get()
    assert (invitation.email, invitation.role, invitation.invited_by) == ("New.Person@example.org", "editor", owner)
    assert mail.outbox[-1].to == ["New.Person@example.org"]
    assert "Acme" in mail.outbox[-1].subject
    link = _link_in_last_email()
    page = owner_client.get(reverse("knowledge:members", args=[workspace.slug])).content.decode()
    assert f'value="http://testserver{link}"' in page
    assert "Invitation emailed to New.Person@example.org" in page
    assert AuditEvent.objects.filter(workspace=workspace, action="member.invite").exists()


def test_invitation_and_sign_up_links_use_the_public_base_url(owner_client, client, workspace, settings):
    # Behind a proxy the request's host is one a person's browser cannot open.
    settings.PUBLIC_BASE_URL = "https://rag.example.org"
    settings.SIGNUP_ENABLED = True

    _invite(owner_client, workspace)
    invitation_mail = mail.outbox[-1].body
    page = owner_client.get(reverse("knowledge:members", args=[workspace.slug])).content.decode()
    client.post(reverse("signup"), {"email": "dana@example.org"})

    assert re.search(r"https://rag\.example\.org/invitations/\S+", invitation_mail)
    assert "testserver" not in invitation_mail
    assert 'value="https://rag.example.org/invitations/' in page
    assert "https://rag.example.org/signup/" in mail.outbox[-1].body


def test_it_refuses_a_second_open_invitation_and_a_member_s_address(owner_client, workspace, owner):
    _invite(owner_client, workspace)

    again = _invite(owner_client, workspace)
    member = _invite(owner_client, workspace, email=owner.email)

    assert "already invited; resend" in again.content.decode()
    assert "already a member" in member.content.decode()
    assert Invitation.objects.count() == 1


def test_it_refuses_a_malformed_address(owner_client, workspace):
    response = _invite(owner_client, workspace, email="not an address")

    assert response.status_code == 400
    assert Invitation.objects.count() == 0


def test_a_new_person_follows_the_link_sets_a_password_and_lands_in_the_workspace(client, owner_client, workspace):
    _invite(owner_client, workspace)
    link = _link_in_last_email()
    client.logout()

    page = client.get(link)
    response = client.post(link, _new_account())

    assert "Join Acme" in page.content.decode()
    assert response.status_code == 302
    assert response.url == reverse("knowledge:workspace", args=[workspace.slug])
    user = get_user_model().objects.get(username="newperson")
    assert (user.email, user.first_name, user.last_name) == ("new.person@example.org", "New", "Person")
    assert Membership.objects.get(user=user, workspace=workspace).role == Role.VIEWER
    assert client.get(response.url).status_code == 200
    assert Invitation.objects.get().accepted_by == user


def test_a_used_link_is_refused(client, owner_client, workspace):
    _invite(owner_client, workspace)
    link = _link_in_last_email()
    client.logout()
    client.post(link, _new_account())
    client.logout()

    again = client.post(link, _new_account(username="someoneelse"))

    assert again.status_code == 410
    assert "already used" in again.content.decode()
    assert not get_user_model().objects.filter(username="someoneelse").exists()


def test_an_expired_link_is_refused(client, owner_client, workspace):
    _invite(owner_client, workspace)
    link = _link_in_last_email()
    Invitation.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    client.logout()

    response = client.post(link, _new_account())

    assert response.status_code == 410
    assert "expired" in response.content.decode()
    assert not get_user_model().objects.filter(username="newperson").exists()


def test_a_tampered_link_is_refused(client, owner_client, workspace):
    _invite(owner_client, workspace)
    link = _link_in_last_email()
    client.logout()

    response = client.get(link[:-3] + "abc/")

    assert response.status_code == 410
    assert "not valid" in response.content.decode()


def test_resending_replaces_the_link_and_withdrawing_kills_it(client, owner_client, workspace):
    _invite(owner_client, workspace)
    first = _link_in_last_email()
    invitation = Invitation.objects.get()

    owner_client.post(reverse("knowledge:invitation_resend", args=[workspace.slug, invitation.pk]))
    second = _link_in_last_email()
    client.logout()
    replaced = client.get(first)
    owner_client.force_login(workspace.memberships.get(role=Role.OWNER).user)
    owner_client.post(reverse("knowledge:invitation_revoke", args=[workspace.slug, invitation.pk]))
    client.logout()
    withdrawn = client.get(second)

    assert first != second
    assert "replaced by a newer invitation" in replaced.content.decode()
    assert "withdrawn" in withdrawn.content.decode()


def test_a_weak_password_is_refused_and_nothing_is_made(client, owner_client, workspace):
    _invite(owner_client, workspace)
    link = _link_in_last_email()
    client.logout()

    response = client.post(link, _new_account(password1="12345678"))

    assert response.status_code == 400
    assert "too common" in response.content.decode() or "entirely numeric" in response.content.decode()
    assert not get_user_model().objects.filter(username="newperson").exists()
    assert Invitation.objects.get().pending


def test_an_existing_user_accepts_signed_in_but_not_as_someone_else(client, owner_client, workspace):
    bea = make_user("bea")
    _invite(owner_client, workspace, email=bea.email, role="editor")
    link = _link_in_last_email()
    intruder = make_user("intruder")

    client.force_login(intruder)
    wrong = client.post(link)
    client.force_login(bea)
    right = client.post(link)

    assert "This invitation is for bea@example.com" in wrong.content.decode()
    assert not Membership.objects.filter(user=intruder, workspace=workspace).exists()
    assert right.status_code == 302
    assert Membership.objects.get(user=bea, workspace=workspace).role == Role.EDITOR


def test_an_existing_user_is_asked_to_log_in_rather_than_to_make_an_account(client, owner_client, workspace):
    bea = make_user("bea")
    _invite(owner_client, workspace, email=bea.email)
    link = _link_in_last_email()
    client.logout()

    page = client.get(link).content.decode()

    assert "already has an account" in page
    assert f"{reverse('login')}?next={link.replace(':', '%3A')}" in page


@pytest.mark.django_db(transaction=True)
def test_two_uses_of_one_link_at_the_same_moment_make_one_member(owner, workspace):
    invitation = invitations.invitation_create(
        workspace=workspace, actor=owner, email="twice@example.org", role="viewer", base_url="http://testserver/"
    )
    token = invitations.invitation_token(invitation)
    barrier = threading.Barrier(2)
    outcomes = []

    def accept(name):
        try:
            barrier.wait()
            invitations.invitation_accept_new_account(
                token=token,
                account=NewAccount(username=name, first_name="", last_name="", password="a-long-passphrase-42"),
            )
            outcomes.append("joined")
        except invitations.InvitationError as err:
            outcomes.append(str(err))
        finally:
            connection.close()

    threads = [threading.Thread(target=accept, args=(name,)) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes)[1] == "joined"
    assert "already used" in sorted(outcomes)[0]
    assert Membership.objects.filter(workspace=workspace, user__email="twice@example.org").count() == 1
    assert get_user_model().objects.filter(email="twice@example.org").count() == 1


def test_people_log_in_with_their_email_too(client, db):
    make_user("carol", password="pw-for-tests-1")

    response = client.post(reverse("login"), {"username": "carol@example.com", "password": "pw-for-tests-1"})

    assert response.status_code == 302
    assert client.get(reverse("home")).status_code == 200


def test_password_login_off_lets_only_superusers_use_a_password(client, db, settings):
    settings.PASSWORD_LOGIN = False
    make_user("carol", password="pw-for-tests-1")
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-1")

    page = client.get(reverse("login")).content.decode()
    refused = client.post(reverse("login"), {"username": "carol", "password": "pw-for-tests-1"})
    admin = client.post(reverse("admin:login"), {"username": "root", "password": "pw-for-tests-1"})

    assert 'name="password"' not in page
    assert refused.status_code == 200
    assert admin.status_code == 302


def test_sign_up_is_closed_by_default(client, db):
    assert client.get(reverse("signup")).status_code == 404
    assert "Ask an owner of a workspace to invite you" in client.get(reverse("login")).content.decode()


def test_sign_up_sends_a_link_to_allowed_domains_only(client, db, settings):
    settings.SIGNUP_ENABLED = True
    settings.SIGNUP_EMAIL_DOMAINS = ["example.org"]

    refused = client.post(reverse("signup"), {"email": "mallory@elsewhere.net"})
    sent = client.post(reverse("signup"), {"email": "dana@Example.org"})
    link = _link_in_last_email()
    made = client.post(link, _new_account(username="dana"))

    assert "open to addresses at example.org" in refused.content.decode()
    assert "We sent a message to <strong>dana@example.org</strong>" in sent.content.decode()
    assert made.status_code == 302
    assert get_user_model().objects.get(username="dana").email == "dana@example.org"
    assert client.post(link, _new_account(username="dana2")).status_code == 410


def test_sign_up_does_not_tell_which_addresses_have_accounts(client, db, settings):
    settings.SIGNUP_ENABLED = True
    make_user("erin")

    response = client.post(reverse("signup"), {"email": "erin@example.com"})

    assert "We sent a message to" in response.content.decode()
    assert "already has one" in mail.outbox[-1].body
    assert "/signup/" not in mail.outbox[-1].body


def test_people_change_their_name_and_password(client, db):
    carol = make_user("carol", password="pw-for-tests-1")
    client.force_login(carol)

    client.post(reverse("account"), {"form": "name", "first_name": "Carol", "last_name": "Danvers"})
    changed = client.post(
        reverse("account"),
        {
            "form": "password",
            "old_password": "pw-for-tests-1",
            "new_password1": "another-long-passphrase-7",
            "new_password2": "another-long-passphrase-7",
        },
    )
    wrong = client.post(
        reverse("account"),
        {"form": "password", "old_password": "nope", "new_password1": "x-long-1-y", "new_password2": "x-long-1-y"},
    )

    carol.refresh_from_db()
    assert carol.get_full_name() == "Carol Danvers"
    assert changed.status_code == 302
    assert carol.check_password("another-long-passphrase-7")
    assert wrong.status_code == 400
    assert client.get(reverse("home")).status_code == 200


def test_an_invitation_email_that_fails_keeps_the_invitation_and_says_so(owner_client, workspace, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 2
    settings.EMAIL_USE_TLS = False

    response = _invite(owner_client, workspace)
    page = owner_client.get(reverse("knowledge:members", args=[workspace.slug])).content.decode()

    assert response.status_code == 302
    invitation = Invitation.objects.get()
    assert invitation.send_error
    assert invitation.sent_at is None
    assert "the email failed" in page
    assert invitations.invitation_token(invitation) in page


def test_other_workspaces_invitations_cannot_be_touched(owner_client, workspace, owner):
    other = make_workspace(slug="other", members={make_user("stranger-owner"): Role.OWNER})
    invitation = Invitation.objects.create(
        workspace=other, email="x@example.org", role="viewer", nonce="n", expires_at=timezone.now() + timedelta(days=1)
    )

    response = owner_client.post(reverse("knowledge:invitation_revoke", args=[workspace.slug, invitation.pk]))

    assert response.status_code == 404
    assert Invitation.objects.get().pending


def test_an_invitation_goes_out_through_a_real_smtp_server(owner_client, workspace, settings):
    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Message

    received = []

    class Inbox(Message):
        def handle_message(self, message):
            received.append(message)

    port = free_port()
    server = Controller(Inbox(), hostname="127.0.0.1", port=port)
    server.start()
    try:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_USE_TLS = "127.0.0.1", port, False

        _invite(owner_client, workspace, email="smtp.person@example.org")
    finally:
        server.stop()

    assert [message["To"] for message in received] == ["smtp.person@example.org"]
    link = LINK.search(received[0].get_payload()).group(1)
    assert owner_client.get(link).status_code == 200
    assert Invitation.objects.get().sent_at is not None
