from django.core.management import call_command
from django.urls import reverse

from knowledge.models import Role
from tests.factories import make_user, make_workspace


def test_it_sends_anonymous_visitors_to_the_login_page(client, db):
    response = client.get(reverse("home"))

    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_it_lets_the_demo_user_log_in_and_see_the_demo_workspace(client, db):
    call_command("ensure_demo", username="demo", password="demo-pass-1")

    response = client.post(reverse("login"), {"username": "demo", "password": "demo-pass-1"}, follow=True)

    assert response.status_code == 200
    assert b"Demo" in response.content
    assert response.context["user"].username == "demo"


def test_it_keeps_the_demo_password_when_run_again(client, db):
    call_command("ensure_demo", username="demo", password="first-pass-1")
    call_command("ensure_demo", username="demo", password="second-pass-2")

    # Through the login page: django-axes checks every password login against its lockouts.
    response = client.post(reverse("login"), {"username": "demo", "password": "first-pass-1"})
    assert response.status_code == 302
    assert client.session["_auth_user_id"]


def test_it_lists_only_the_users_workspaces(client, db):
    alice, bob = make_user("alice"), make_user("bob")
    make_workspace(slug="alices", name="Alice's notes", members={alice: Role.VIEWER})
    make_workspace(slug="bobs", name="Bob's secrets", members={bob: Role.OWNER})
    client.force_login(alice)

    response = client.get(reverse("home"))

    assert b"Alice&#x27;s notes" in response.content
    assert b"/workspaces/alices/" in response.content
    # Bob's workspace by name and by link; not the letters "Bob", which a random CSRF token can hold.
    assert b"Bob&#x27;s secrets" not in response.content
    assert b"/workspaces/bobs/" not in response.content


def test_it_rejects_a_wrong_password(client, db):
    make_user("carol", password="right-password-1")

    response = client.post(reverse("login"), {"username": "carol", "password": "wrong"})

    assert response.status_code == 200
    assert not response.wsgi_request.user.is_authenticated
