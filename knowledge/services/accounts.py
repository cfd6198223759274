"""Accounts: the users people make for themselves (through an invitation, a sign-up link or their
first single sign-on), their name and password, and the emails that bring them in.

Links are signatures made with the secret key (django.core.signing): nothing secret is stored,
and a link that was tampered with or has expired is refused before anything is read.
"""

import logging
import smtplib
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import IntegrityError, connection, transaction
from django.template.loader import render_to_string
from django.urls import reverse

from knowledge.services import links
from knowledge.services.ratelimits import rate_limit_check

logger = logging.getLogger(__name__)

SIGNUP_SALT = "knowledge.accounts.signup"
# A sign-up link is good for a day: long enough to find the email, short enough to forget it.
SIGNUP_LINK_SECONDS = 24 * 3600
NAME_MAX_CHARS = 150


class AccountError(Exception):
    """Something a person asked for that cannot be done; `str(err)` tells them what to do instead."""


def normalize_email(email: str) -> str:
    """The address as stored and compared: trimmed, its domain in lower case."""
    email = (email or "").strip()
    try:
        validate_email(email)
    except ValidationError:
        raise AccountError(f"{email!r} is not an email address." if email else "Enter an email address.") from None
    local, _, domain = email.rpartition("@")
    return f"{local}@{domain.lower()}"


def lock_email(email: str) -> None:
    """Serialize, until the transaction ends, everything that makes an account for this address:
    Django's user table does not make emails unique, so two uses of one link at the same moment
    would otherwise make two accounts."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 25))", [email.lower()])


def user_with_email(email: str):
    """The one active user with this address (case-insensitive), or None; several is an error an
    administrator has to resolve, since we cannot tell which of them is meant."""
    users = list(get_user_model().objects.filter(email__iexact=email, is_active=True)[:2])
    if len(users) > 1:
        raise AccountError(f"Several accounts use {email}; ask an administrator to merge them.")
    return users[0] if users else None


def username_suggestion(email: str) -> str:
    """A free username from the address's local part: ana, then ana-2, ana-3, ..."""
    field = get_user_model()._meta.get_field("username")
    base = "".join(c for c in email.partition("@")[0].lower() if c.isalnum() or c in "._-")[:140] or "user"
    taken = set(get_user_model().objects.filter(username__startswith=base).values_list("username", flat=True))
    candidate, number = base, 1
    while candidate in taken:
        number += 1
        candidate = f"{base}-{number}"
    return candidate[: field.max_length]


@dataclass(frozen=True)
class NewAccount:
    """What a person chooses for a new account; the email comes from the link they followed."""

    username: str
    first_name: str
    last_name: str
    password: str | None


def user_create(*, email: str, account: NewAccount):
    """A new active user with this address. The password is checked against the validators
    (a user made by single sign-on has none: it signs in through the provider)."""
    User = get_user_model()
    username = account.username.strip()
    user = User(
        username=username,
        email=email,
        first_name=account.first_name.strip()[:NAME_MAX_CHARS],
        last_name=account.last_name.strip()[:NAME_MAX_CHARS],
    )
    try:
        user.clean_fields(exclude=["password", "last_login", "date_joined"])
    except ValidationError as err:
        raise AccountError(
            " ".join(message for messages in err.message_dict.values() for message in messages)
        ) from None
    if account.password is None:
        user.set_unusable_password()
    else:
        try:
            validate_password(account.password, user)
        except ValidationError as err:
            raise AccountError(" ".join(err.messages)) from None
        user.set_password(account.password)
    try:
        with transaction.atomic():
            if User.objects.filter(username__iexact=username).exists():
                raise AccountError(f"The username {username!r} is taken; choose another.")
            user.save()
    except IntegrityError:
        raise AccountError(f"The username {username!r} is taken; choose another.") from None
    return user


def account_update_name(*, user, first_name: str, last_name: str):
    user.first_name, user.last_name = first_name.strip()[:NAME_MAX_CHARS], last_name.strip()[:NAME_MAX_CHARS]
    user.save(update_fields=["first_name", "last_name"])
    return user


def email_send(*, to: str, subject: str, template: str, context: dict) -> str:
    """Send one email through Django's backend (the console unless EMAIL_HOST is set). Returns ""
    when it went, or why it did not: a mail server that refuses must not lose the invitation, whose
    link the owner can still copy."""
    body = render_to_string(template, context)
    try:
        send_mail(subject, body, None, [to], fail_silently=False)
    except (OSError, smtplib.SMTPException) as exc:
        logger.warning("Could not send %r to %s: %s", subject, to, exc)
        return f"The mail server refused or could not be reached ({exc.__class__.__name__}: {exc})"[:300]
    return ""


# --- Sign-up ------------------------------------------------------------------------------


def signup_check_email(email: str) -> str:
    """The address if it may sign up here; AccountError saying why not otherwise."""
    if not settings.SIGNUP_ENABLED:
        raise AccountError("Sign-up is closed here: ask an owner of a workspace to invite you.")
    email = normalize_email(email)
    domains = settings.SIGNUP_EMAIL_DOMAINS
    if domains and email.rpartition("@")[2] not in domains:
        raise AccountError(f"Sign-up is open to addresses at {', '.join(domains)}; ask an owner to invite you.")
    return email


def signup_start(*, email: str, base_url: str, address: str | None) -> str:
    """Send a link that lets the owner of the address make an account; returns the address.

    An address that already has an account gets a note saying so instead of a link, and the page
    says the same either way, so sign-up never tells anyone which addresses have accounts."""
    email = signup_check_email(email)
    rate_limit_check(limit="RATE_LIMIT_SIGNUP", address=address or "unknown")
    if user_with_email(email) is not None:
        email_send(
            to=email,
            subject="You already have an account",
            template="email/signup_exists.txt",
            context={"login_url": links.absolute(base_url, reverse("login")), "email": email},
        )
        return email
    token = signing.TimestampSigner(salt=SIGNUP_SALT).sign_object({"email": email})
    email_send(
        to=email,
        subject="Finish making your account",
        template="email/signup.txt",
        context={"link": links.absolute(base_url, reverse("signup_complete", args=[token])), "email": email},
    )
    return email


def signup_email_from_token(token: str) -> str:
    """The address a sign-up link was sent to, if the link is intact, fresh and still unused."""
    try:
        email = signing.TimestampSigner(salt=SIGNUP_SALT).unsign_object(token, max_age=SIGNUP_LINK_SECONDS)["email"]
    except signing.SignatureExpired:
        raise AccountError("This sign-up link has expired (links last a day); sign up again for a new one.") from None
    except (signing.BadSignature, KeyError, TypeError):
        raise AccountError("This sign-up link is not valid; check that you copied all of it.") from None
    email = signup_check_email(email)
    if user_with_email(email) is not None:
        raise AccountError(f"{email} already has an account: log in instead.")
    return email


def signup_complete(*, token: str, account: NewAccount):
    """The account of a sign-up link: its address, the person's username, name and password."""
    with transaction.atomic():
        email = signup_email_from_token(token)
        lock_email(email)
        # Read again under the lock: the same link may have just been used in another tab.
        return user_create(email=signup_email_from_token(token), account=account)
