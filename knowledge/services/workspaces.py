"""Writes about workspaces, memberships and the audit log. Documents and ingestion are in
knowledge.services.ingestion, the graph's curation in knowledge.services.curation."""

import itertools
import logging

from django.contrib.auth import get_user_model
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils.text import slugify

from knowledge.models import AuditEvent, Chunk, Document, Entity, Membership, Relation, Role, Workspace
from knowledge.services import events

logger = logging.getLogger(__name__)


def _rows_of(model, **visible) -> Coalesce:
    rows = (
        model.objects.filter(workspace=OuterRef("pk"), **visible).order_by().values("workspace").annotate(n=Count("*"))
    )
    return Coalesce(Subquery(rows.values("n"), output_field=IntegerField()), 0)


def workspace_refresh_counts(*, workspace_id: int) -> None:
    """Count what the workspace serves: chunks, entities and relations of published documents,
    and its disabled documents (while there are none, retrieval adds no scope clause)."""
    Workspace.objects.filter(pk=workspace_id).update(
        chunk_count=_rows_of(Chunk, embedding__isnull=False),
        entity_count=_rows_of(Entity, published=True),
        relation_count=_rows_of(Relation, published=True),
        disabled_documents=_rows_of(Document, enabled=False, superseded_by__isnull=True),
    )


def audit_record(*, workspace: Workspace, actor, action: str, summary: str, detail: dict | None = None) -> AuditEvent:
    """Write one line of the workspace's audit log (merges, undos, deletions, membership changes).

    Call it inside the transaction of the change it records, so both happen or neither does.
    """
    return AuditEvent.objects.create(
        workspace=workspace,
        actor=actor if actor is not None and actor.is_authenticated else None,
        action=action,
        summary=summary[:500],
        detail=detail or {},
    )


class MembershipError(Exception):
    """A membership or workspace change that breaks a rule; `str(err)` is shown to the owner as is."""


def _user_by_username_or_email(identifier: str):
    users = get_user_model().objects.filter(is_active=True)
    user = users.filter(username=identifier).first()
    if user is not None:
        return user
    by_email = list(users.filter(email__iexact=identifier)[:2])
    if len(by_email) > 1:
        raise MembershipError(f"Several users have the email {identifier}; add them by username instead.")
    if not by_email:
        if "@" in identifier:
            raise MembershipError(
                f"No account uses {identifier}. Invite them by email below: they get a link to set a password "
                "(or to sign in with single sign-on) and join with the role you choose."
            )
        raise MembershipError(
            f"No user named {identifier!r}. To bring in someone without an account, invite them by email below."
        )
    return by_email[0]


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise MembershipError(f"Unknown role {role!r}; choose one of {', '.join(Role.values)}.")


def lock_memberships(workspace_id: int) -> None:
    # Row lock on the workspace serializes membership changes, so two owners demoting each
    # other at the same moment cannot leave a workspace without an owner.
    Workspace.objects.select_for_update().only("pk").get(pk=workspace_id)


def _check_an_owner_remains(membership: Membership) -> None:
    others = Membership.objects.filter(workspace_id=membership.workspace_id, role=Role.OWNER).exclude(pk=membership.pk)
    if membership.role == Role.OWNER and not others.exists():
        raise MembershipError(
            f"{membership.user.get_username()} is the last owner of this workspace; make someone else owner first."
        )


def membership_add(*, workspace: Workspace, actor, identifier: str, role: str) -> Membership:
    """Add an existing user, found by username or email, to the workspace."""
    _check_role(role)
    user = _user_by_username_or_email(identifier.strip())
    with transaction.atomic():
        lock_memberships(workspace.pk)
        existing = Membership.objects.filter(workspace=workspace, user=user).first()
        if existing is not None:
            raise MembershipError(f"{user.get_username()} is already a member ({existing.role}).")
        membership = Membership.objects.create(workspace=workspace, user=user, role=role)
        audit_record(
            workspace=workspace,
            actor=actor,
            action="member.add",
            summary=f"Added {user.get_username()} as {role}",
            detail={"user_id": user.pk, "username": user.get_username(), "role": role},
        )
    return membership


def membership_set_role(*, membership: Membership, actor, role: str) -> Membership:
    _check_role(role)
    with transaction.atomic():
        lock_memberships(membership.workspace_id)
        membership = Membership.objects.select_related("user", "workspace").get(pk=membership.pk)
        previous = membership.role
        if previous == role:
            return membership
        if role != Role.OWNER:
            _check_an_owner_remains(membership)
        membership.role = role
        membership.save(update_fields=["role"])
        events.publish_membership_changed(workspace_id=membership.workspace_id, user_id=membership.user_id)
        username = membership.user.get_username()
        audit_record(
            workspace=membership.workspace,
            actor=actor,
            action="member.role",
            summary=f"Changed {username} from {previous} to {role}",
            detail={"user_id": membership.user_id, "username": username, "from": previous, "to": role},
        )
    return membership


def membership_remove(*, membership: Membership, actor) -> None:
    """Remove a member; a member removing themselves is leaving. The last owner cannot go."""
    with transaction.atomic():
        lock_memberships(membership.workspace_id)
        membership = Membership.objects.select_related("user", "workspace").get(pk=membership.pk)
        _check_an_owner_remains(membership)
        username = membership.user.get_username()
        leaving = actor is not None and actor.pk == membership.user_id
        membership.delete()
        events.publish_membership_changed(workspace_id=membership.workspace_id, user_id=membership.user_id)
        audit_record(
            workspace=membership.workspace,
            actor=actor,
            action="member.leave" if leaving else "member.remove",
            summary=f"{username} left" if leaving else f"Removed {username} ({membership.role})",
            detail={"user_id": membership.user_id, "username": username, "role": membership.role},
        )


def _free_slug(name: str) -> str:
    base = slugify(name)[:70].strip("-") or "workspace"
    taken = set(Workspace.objects.filter(slug__startswith=base).values_list("slug", flat=True))
    if base not in taken:
        return base
    return next(f"{base}-{n}" for n in itertools.count(2) if f"{base}-{n}" not in taken)


def workspace_create(*, user, name: str, description: str = "") -> Workspace:
    """A new workspace owned by `user`."""
    for _ in range(5):
        try:
            with transaction.atomic():
                workspace = Workspace.objects.create(name=name, slug=_free_slug(name), description=description)
                Membership.objects.create(workspace=workspace, user=user, role=Role.OWNER)
                audit_record(workspace=workspace, actor=user, action="workspace.create", summary=f"Created {name}")
                return workspace
        except IntegrityError:
            # Someone took the same slug between the check and the insert; pick again.
            continue
    raise MembershipError("Could not find a free address for this workspace name; try another name.")


WORKSPACE_SETTINGS = (
    "name",
    "description",
    "chunk_token_size",
    "chunk_overlap_tokens",
    "gleaning_passes",
    "entity_types",
)


def workspace_update(*, workspace: Workspace, actor, **changes) -> Workspace:
    """Change the workspace's name, description or indexing settings (they apply to documents ingested later)."""
    unknown = set(changes) - set(WORKSPACE_SETTINGS)
    if unknown:
        raise TypeError(f"workspace_update() got unknown settings: {', '.join(sorted(unknown))}")
    with transaction.atomic():
        workspace = Workspace.objects.select_for_update().get(pk=workspace.pk)
        changed = {
            field: {"from": getattr(workspace, field), "to": value}
            for field, value in changes.items()
            if getattr(workspace, field) != value
        }
        if not changed:
            return workspace
        for field in changed:
            setattr(workspace, field, changes[field])
        workspace.save(update_fields=list(changed))
        audit_record(
            workspace=workspace,
            actor=actor,
            action="workspace.update",
            summary=f"Changed settings: {', '.join(changed)}",
            detail=changed,
        )
    return workspace


def workspace_delete(*, workspace: Workspace, actor) -> None:
    """Delete the workspace with everything in it, stored source files included (after commit)."""
    files = list(
        Document.objects.filter(workspace=workspace).exclude(source_file="").values_list("source_file", flat=True)
    )
    with transaction.atomic():
        Workspace.objects.filter(pk=workspace.pk).delete()

        def remove_files():
            for name in files:
                default_storage.delete(name)

        transaction.on_commit(remove_files)
    # The audit log goes with the workspace, so the deletion itself is logged where it outlives it.
    logger.info("workspace %s (%s) deleted by %s", workspace.slug, workspace.pk, getattr(actor, "pk", None))
