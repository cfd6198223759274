"""API tokens: expiry, revocation, scope, the record of use, and the API's rate limit (issue 16)."""

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from knowledge.models import ApiToken
from knowledge.services.api_tokens import (
    SCOPE_ASK,
    SCOPE_READ,
    SCOPE_WRITE,
    api_token_authenticate,
    api_token_create,
    api_token_revoke,
    user_for_api_token,
)

# A workspace without documents: the API answers 409 ("nothing to ask about yet") to a caller it
# let in, so 409 means authenticated and 401, 403 or 429 mean refused before the question.
LET_IN = 409


def ask(secret, *, slug="acme", address="203.0.113.7"):
    return Client().post(
        reverse("knowledge:api_query", args=[slug]),
        json.dumps({"question": "Anything?"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
        REMOTE_ADDR=address,
    )


def test_it_records_when_and_from_where_a_token_was_last_used(workspace, owner):
    token, secret = api_token_create(user=owner, name="bot")

    assert ask(secret, address="198.51.100.4").status_code == LET_IN

    token.refresh_from_db()
    assert token.last_used_ip == "198.51.100.4"
    assert timezone.now() - token.last_used_at < timedelta(minutes=1)


def test_it_refuses_a_revoked_token_on_the_next_request(workspace, owner):
    token, secret = api_token_create(user=owner, name="bot")
    assert ask(secret).status_code == LET_IN

    api_token_revoke(token=token)

    response = ask(secret)
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]
    assert user_for_api_token(secret) is None


def test_it_refuses_an_expired_token(workspace, owner):
    token, secret = api_token_create(user=owner, name="bot", expires_in=timedelta(days=1))
    assert ask(secret).status_code == LET_IN

    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert ask(secret).status_code == 401
    assert api_token_authenticate(secret) is None


def test_it_refuses_the_token_of_an_inactive_user(workspace, owner):
    _, secret = api_token_create(user=owner, name="bot")
    owner.is_active = False
    owner.save()

    assert ask(secret).status_code == 401


def test_each_scope_allows_itself_and_the_narrower_ones():
    read, ask_, write = (ApiToken(scope=scope) for scope in (SCOPE_READ, SCOPE_ASK, SCOPE_WRITE))

    assert [read.allows(scope) for scope in (SCOPE_READ, SCOPE_ASK, SCOPE_WRITE)] == [True, False, False]
    assert [ask_.allows(scope) for scope in (SCOPE_READ, SCOPE_ASK, SCOPE_WRITE)] == [True, True, False]
    assert [write.allows(scope) for scope in (SCOPE_READ, SCOPE_ASK, SCOPE_WRITE)] == [True, True, True]
    assert not ApiToken(scope="full").allows(SCOPE_READ)  # a value no migration knows allows nothing


def test_it_makes_ask_only_tokens_unless_told_otherwise(owner):
    token, _ = api_token_create(user=owner, name="bot")
    assert token.scope == SCOPE_ASK
    with pytest.raises(ValueError, match="Unknown scope"):
        api_token_create(user=owner, name="bot", scope="admin")


def test_it_creates_a_scoped_expiring_token_from_the_command(owner, capsys):
    call_command("create_api_token", "--user", "owner", "--name", "ci", "--scope", "write", "--expires-days", "30")
    secret = capsys.readouterr().out.strip()

    token = api_token_authenticate(secret)
    assert token.scope == SCOPE_WRITE
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)


def test_it_answers_429_with_retry_after_past_the_api_limit_per_token(
    workspace, owner, settings, ten_seconds_into_an_hour
):
    settings.RATE_LIMIT_API = (3, 60)
    _, first = api_token_create(user=owner, name="first")
    _, second = api_token_create(user=owner, name="second")

    assert [ask(first).status_code for _ in range(3)] == [LET_IN] * 3
    refused = ask(first)

    assert refused.status_code == 429
    assert int(refused["Retry-After"]) == 50
    assert "Too many API requests" in refused.json()["error"]
    # Each token has its own budget.
    assert ask(second).status_code == LET_IN


def test_it_limits_session_api_requests_per_user(workspace, owner, settings, ten_seconds_into_an_hour):
    settings.RATE_LIMIT_API = (1, 3600)
    client = Client()
    client.force_login(owner)

    def post():
        return client.post(
            reverse("knowledge:api_query", args=["acme"]),
            json.dumps({"question": "Anything?"}),
            content_type="application/json",
        )

    assert post().status_code == LET_IN
    refused = post()
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) == 3590


def test_it_lets_requests_through_when_the_cache_is_unreachable(workspace, owner, settings, caplog):
    settings.RATE_LIMIT_API = (1, 60)
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:9/0"}
    }
    _, secret = api_token_create(user=owner, name="bot")

    assert [ask(secret).status_code for _ in range(2)] == [LET_IN, LET_IN]
    assert "rate limit RATE_LIMIT_API not counted" in caplog.text
