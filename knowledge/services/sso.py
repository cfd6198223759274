"""Single sign-on: who a person signing in through the identity provider is here, from the claims
the provider vouched for. The protocol (discovery, the code flow, token checks) is the web door's
(knowledge/web/sso.py, over mozilla-django-oidc); this module only decides about accounts:

- a person is matched by their verified email; an unverified one is refused, since anybody can
  type any address into some providers' profiles;
- a new person gets an account on first sign-in when OIDC_CREATE_USERS allows it;
- the groups claim, mapped by OIDC_GROUP_ROLES, grants workspace roles at every sign-in.
"""

import logging

from django.conf import settings
from django.db import transaction

from knowledge.models import ROLE_RANK, Membership, Workspace
from knowledge.services import events
from knowledge.services.accounts import (
    AccountError,
    NewAccount,
    lock_email,
    normalize_email,
    user_create,
    user_with_email,
    username_suggestion,
)
from knowledge.services.workspaces import audit_record, lock_memberships

logger = logging.getLogger(__name__)


class SignInRefused(AccountError):
    """The provider signed the person in, and we will not: the message says why, for the page."""


def sso_user_for_claims(claims: dict):
    """The user these verified claims belong to, made on first sign-in when allowed, with the
    roles their groups map to. Raises SignInRefused."""
    if not claims.get("email"):
        raise SignInRefused(
            "The identity provider sent no email address, so we cannot tell who you are here. "
            "Ask your administrator to release the 'email' claim to this application."
        )
    try:
        email = normalize_email(claims["email"])
    except AccountError as err:
        raise SignInRefused(f"The identity provider sent an address we cannot use: {err}") from None
    if claims.get("email_verified") is not True:
        raise SignInRefused(
            f"The identity provider has not verified {email}, so signing in with it could let someone "
            "else into this account. Verify the address with your identity provider, then sign in again."
        )
    with transaction.atomic():
        lock_email(email)
        user = user_with_email(email)
        if user is None:
            if not settings.OIDC_CREATE_USERS:
                raise SignInRefused(
                    f"There is no account for {email} here, and accounts are not made at first sign-in. "
                    "Ask an owner of a workspace to invite you."
                )
            user = user_create(email=email, account=_account_from_claims(claims, email))
            logger.info("single sign-on made the account %s for %s", user.get_username(), email)
        _grant_group_roles(user, claims.get(settings.OIDC_GROUPS_CLAIM))
    return user


def _account_from_claims(claims: dict, email: str) -> NewAccount:
    wanted = str(claims.get("preferred_username") or "").strip()
    username = wanted if wanted and not _taken(wanted) else username_suggestion(email)
    return NewAccount(
        username=username,
        first_name=str(claims.get("given_name") or claims.get("name") or ""),
        last_name=str(claims.get("family_name") or ""),
        password=None,
    )


def _taken(username: str) -> bool:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(username__iexact=username).exists()


def _grant_group_roles(user, groups) -> None:
    """Each mapped group grants its workspace role: a membership is made, or a lower role raised.
    Nothing is taken away here: removing people and lowering roles stay with the owners, so the
    provider can never leave a workspace without an owner."""
    if isinstance(groups, str):
        groups = [groups]
    wanted: dict[str, str] = {}
    for group in groups or []:
        for slug, role in settings.OIDC_GROUP_ROLES.get(str(group), []):
            if ROLE_RANK[role] > ROLE_RANK.get(wanted.get(slug), 0):
                wanted[slug] = role
    for workspace in Workspace.objects.filter(slug__in=wanted):
        role = wanted[workspace.slug]
        lock_memberships(workspace.pk)
        membership = Membership.objects.filter(workspace=workspace, user=user).first()
        previous = membership.role if membership else None
        if membership is None:
            Membership.objects.create(workspace=workspace, user=user, role=role)
        elif ROLE_RANK[role] > ROLE_RANK[membership.role]:
            membership.role = role
            membership.save(update_fields=["role"])
        else:
            continue
        events.publish_membership_changed(workspace_id=workspace.pk, user_id=user.pk)
        audit_record(
            workspace=workspace,
            actor=None,
            action="member.sso",
            summary=f"Single sign-on made {user.get_username()} {role}"
            + (f" (was {previous})" if previous else "")
            + " by the provider's groups",
            detail={"user_id": user.pk, "role": role, "from": previous},
        )
