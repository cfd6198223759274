"""Invitations: an owner invites an email address into a workspace with a role; the person follows
the link, sets a password (or signs in, with a password or single sign-on) and is a member.

The link is a signature of the invitation's id, nonce and expiry made with the secret key, so it
can be shown again to the owner (for teams without mail) without being stored; the row decides
whether it is still good: used once (`accepted_at`, taken under a row lock), revocable, and
resending draws a new nonce and expiry, so the older link stops working.
"""

import secrets
from datetime import timedelta

from django.conf import settings
from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from knowledge.models import ROLE_RANK, Invitation, Membership, Role, Workspace
from knowledge.services import events, links
from knowledge.services.accounts import (
    AccountError,
    NewAccount,
    email_send,
    lock_email,
    normalize_email,
    user_create,
    user_with_email,
)
from knowledge.services.ratelimits import rate_limit_check
from knowledge.services.workspaces import audit_record, lock_memberships

SALT = "knowledge.invitations"


class InvitationError(AccountError):
    """An invitation that cannot be made, sent or used; the message says why and what to do."""


def invitation_token(invitation: Invitation) -> str:
    expires = int(invitation.expires_at.timestamp())
    return signing.Signer(salt=SALT).sign_object({"i": invitation.pk, "n": invitation.nonce, "e": expires})


def invitation_link(invitation: Invitation, *, base_url: str) -> str:
    return links.absolute(base_url, reverse("invitation", args=[invitation_token(invitation)]))


def _send(invitation: Invitation, *, base_url: str) -> Invitation:
    error = email_send(
        to=invitation.email,
        subject=f"You are invited to {invitation.workspace.name}",
        template="email/invitation.txt",
        context={
            "invitation": invitation,
            "inviter": invitation.invited_by,
            "link": invitation_link(invitation, base_url=base_url),
            "days": settings.INVITATION_DAYS,
        },
    )
    invitation.send_error = error
    invitation.sent_at = None if error else timezone.now()
    invitation.save(update_fields=["send_error", "sent_at"])
    return invitation


def invitation_create(*, workspace: Workspace, actor, email: str, role: str, base_url: str) -> Invitation:
    """Invite an address with a role, and email the link (the owner sees it too)."""
    if role not in Role.values:
        raise InvitationError(f"Unknown role {role!r}; choose one of {', '.join(Role.values)}.")
    email = normalize_email(email)
    if Membership.objects.filter(workspace=workspace, user__email__iexact=email).exists():
        raise InvitationError(f"{email} is already a member of {workspace.name}.")
    rate_limit_check(limit="RATE_LIMIT_INVITE", user=actor)
    try:
        with transaction.atomic():
            invitation = Invitation.objects.create(
                workspace=workspace,
                email=email,
                role=role,
                invited_by=actor,
                nonce=secrets.token_hex(16),
                expires_at=timezone.now() + timedelta(days=settings.INVITATION_DAYS),
            )
            audit_record(
                workspace=workspace,
                actor=actor,
                action="member.invite",
                summary=f"Invited {email} as {role}",
                detail={"invitation_id": invitation.pk, "email": email, "role": role},
            )
    except IntegrityError:
        raise InvitationError(f"{email} is already invited; resend the invitation from the list below.") from None
    return _send(invitation, base_url=base_url)


def invitation_resend(*, invitation: Invitation, actor, base_url: str) -> Invitation:
    """Send the invitation again with a new link and a new expiry; the older link stops working."""
    if not invitation.pending:
        raise InvitationError(f"The invitation of {invitation.email} was already used or withdrawn.")
    rate_limit_check(limit="RATE_LIMIT_INVITE", user=actor)
    with transaction.atomic():
        invitation.nonce = secrets.token_hex(16)
        invitation.expires_at = timezone.now() + timedelta(days=settings.INVITATION_DAYS)
        invitation.save(update_fields=["nonce", "expires_at"])
        audit_record(
            workspace=invitation.workspace,
            actor=actor,
            action="member.invite_resend",
            summary=f"Sent the invitation of {invitation.email} again",
            detail={"invitation_id": invitation.pk, "email": invitation.email},
        )
    return _send(invitation, base_url=base_url)


def invitation_revoke(*, invitation: Invitation, actor) -> None:
    with transaction.atomic():
        changed = Invitation.objects.filter(pk=invitation.pk, accepted_at=None, revoked_at=None).update(
            revoked_at=timezone.now()
        )
        if not changed:
            raise InvitationError(f"The invitation of {invitation.email} was already used or withdrawn.")
        audit_record(
            workspace=invitation.workspace,
            actor=actor,
            action="member.invite_revoke",
            summary=f"Withdrew the invitation of {invitation.email}",
            detail={"invitation_id": invitation.pk, "email": invitation.email},
        )


def invitation_from_token(token: str, *, for_update: bool = False) -> Invitation:
    """The invitation a link names, if the link is intact and the invitation still good; else
    InvitationError saying what happened (`invitation` set on it when there is one)."""
    try:
        data = signing.Signer(salt=SALT).unsign_object(token)
        pk, nonce = int(data["i"]), str(data["n"])
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        raise InvitationError("This invitation link is not valid; check that you copied all of it.") from None
    invitations = Invitation.objects.select_related("workspace", "invited_by")
    if for_update:
        invitations = invitations.select_for_update(of=("self",))
    invitation = invitations.filter(pk=pk).first()
    if invitation is None:
        raise InvitationError("This invitation no longer exists; ask an owner of the workspace for a new one.")
    error = _why_not_usable(invitation, nonce)
    if error:
        err = InvitationError(error)
        err.invitation = invitation
        raise err
    return invitation


def _why_not_usable(invitation: Invitation, nonce: str) -> str:
    owner = f"an owner of {invitation.workspace.name}"
    if invitation.accepted_at is not None:
        return "This invitation was already used. Log in to reach the workspace."
    if invitation.revoked_at is not None:
        return f"This invitation was withdrawn; ask {owner} if you should still join."
    if not secrets.compare_digest(invitation.nonce, nonce):
        return "This link was replaced by a newer invitation; use the link in the latest email."
    if invitation.expires_at <= timezone.now():
        return f"This invitation expired on {invitation.expires_at:%d %B %Y}; ask {owner} to send it again."
    return ""


def invitation_accept(*, token: str, user) -> Membership:
    """The signed-in user joins with the invited role. One use only: the invitation row is locked,
    so two clicks of one link (or two people sharing it) make one membership."""
    with transaction.atomic():
        invitation = invitation_from_token(token, for_update=True)
        if (user.email or "").casefold() != invitation.email.casefold():
            raise InvitationError(
                f"This invitation is for {invitation.email}, and you are signed in as {user.get_username()}"
                f"{f' ({user.email})' if user.email else ''}. Log out, then open the link again."
            )
        return _join(invitation, user)


def invitation_accept_new_account(*, token: str, account: NewAccount):
    """Make the invited person's account (the invitation's address, their username, name and
    password) and join them to the workspace, in one transaction."""
    with transaction.atomic():
        invitation = invitation_from_token(token, for_update=True)
        lock_email(invitation.email)
        if user_with_email(invitation.email) is not None:
            raise InvitationError(f"{invitation.email} already has an account: log in to accept the invitation.")
        user = user_create(email=invitation.email, account=account)
        _join(invitation, user)
    return user


def _join(invitation: Invitation, user) -> Membership:
    lock_memberships(invitation.workspace_id)
    membership = Membership.objects.filter(workspace=invitation.workspace, user=user).first()
    if membership is None:
        membership = Membership.objects.create(workspace=invitation.workspace, user=user, role=invitation.role)
    elif ROLE_RANK[invitation.role] > ROLE_RANK[membership.role]:
        # Joined meanwhile (another invitation, single sign-on): the invitation only ever raises a role.
        membership.role = invitation.role
        membership.save(update_fields=["role"])
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    events.publish_membership_changed(workspace_id=invitation.workspace_id, user_id=user.pk)
    audit_record(
        workspace=invitation.workspace,
        actor=user,
        action="member.join",
        summary=f"{user.get_username()} joined as {membership.role} (invited by "
        f"{invitation.invited_by.get_username() if invitation.invited_by else 'a former member'})",
        detail={"invitation_id": invitation.pk, "user_id": user.pk, "role": membership.role},
    )
    return membership


def invitations_pending(*, workspace: Workspace):
    """The workspace's open invitations, newest first, expired ones included (they can be resent)."""
    return workspace.invitations.filter(accepted_at=None, revoked_at=None).select_related("invited_by")
