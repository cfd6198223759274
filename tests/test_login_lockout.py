"""Failed logins lock the username out from that address, with a pause that grows (django-axes)."""

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import make_user

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests-1"


@pytest.fixture(autouse=True)
def limits(settings):
    settings.LOGIN_FAILURE_LIMIT = settings.AXES_FAILURE_LIMIT = 3
    settings.LOGIN_LOCKOUT_MINUTES = 5
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def log_in(client, password, *, username="alice", address="198.51.100.10"):
    return client.post(reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=address)


def test_it_locks_out_a_username_after_too_many_wrong_passwords_even_with_the_right_one():
    make_user("alice", password=PASSWORD)
    client = Client()

    wrong = [log_in(client, "guess-1"), log_in(client, "guess-2")]
    assert [response.status_code for response in wrong] == [200, 200]
    locked = log_in(client, "guess-3")

    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    assert int(locked["Retry-After"]) == 5 * 60
    right = log_in(client, PASSWORD)
    assert right.status_code == 429
    assert "_auth_user_id" not in client.session


def test_it_doubles_the_pause_for_every_attempt_during_a_lockout():
    make_user("alice", password=PASSWORD)
    client = Client()
    for attempt in range(3):
        log_in(client, f"guess-{attempt}")

    pauses = [int(log_in(client, "guess-again")["Retry-After"]) for _ in range(3)]

    assert pauses == [10 * 60, 20 * 60, 40 * 60]


def test_it_keeps_the_lockout_to_the_address_that_failed():
    make_user("alice", password=PASSWORD)
    for attempt in range(3):
        log_in(Client(), f"guess-{attempt}", address="198.51.100.10")

    elsewhere = log_in(Client(), PASSWORD, address="203.0.113.20")

    assert elsewhere.status_code == 302


def test_it_forgets_failures_after_a_successful_login():
    make_user("alice", password=PASSWORD)
    client = Client()
    log_in(client, "guess-1")
    log_in(client, "guess-2")
    assert log_in(client, PASSWORD).status_code == 302
    client.logout()

    assert [log_in(client, f"again-{n}").status_code for n in range(2)] == [200, 200]
