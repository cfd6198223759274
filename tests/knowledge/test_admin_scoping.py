"""Every ModelAdmin is scoped: a staff user with every model permission of the apps sees, filters
by, and is offered in forms only what belongs to their workspaces (issue 16, point 4).

Like test_permissions walks the URLs, this walks the admin registry: a ModelAdmin registered
without a case below fails the test until someone says how it is scoped.
"""

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db.models import Model
from django.urls import reverse

from chat.models import Conversation
from knowledge.models import (
    ApiToken,
    Document,
    Entity,
    EntityAlias,
    EvaluationRun,
    EvaluationSet,
    MergeLog,
    Relation,
    Role,
    Workspace,
)
from knowledge.services.api_tokens import api_token_create
from tests.factories import make_document, make_entity, make_relation, make_user, make_workspace

pytestmark = pytest.mark.django_db

THEIRS = "Theirs Secret"


def _entity(workspace, label):
    return make_entity(workspace, f"{label} entity")


def _relation(workspace, label):
    return make_relation(make_entity(workspace, f"{label} a"), make_entity(workspace, f"{label} b"))


def _alias(workspace, label):
    return EntityAlias.objects.create(workspace=workspace, entity=_entity(workspace, label), name=f"{label} alias")


def _merge_log(workspace, label):
    return MergeLog.objects.create(workspace=workspace, survivor_name=f"{label} survivor", merged_names=["x"])


def _evaluation_set(workspace, label):
    return EvaluationSet.objects.create(workspace=workspace, name=f"{label} questions")


def _evaluation_run(workspace, label):
    return EvaluationRun.objects.create(
        workspace=workspace, evaluation_set=_evaluation_set(workspace, label), system_a="lightrag", system_b="naive"
    )


def _conversation(workspace, label):
    # The staff user's own conversation where they are a member; a stranger's elsewhere.
    user = (
        workspace.memberships.get().user if workspace.name == THEIRS else get_user_model().objects.get(username="staff")
    )
    return Conversation.objects.create(workspace=workspace, user=user, title=f"{label} conversation")


def _token(workspace, label):
    user = (
        workspace.memberships.get().user if workspace.name == THEIRS else get_user_model().objects.get(username="staff")
    )
    return api_token_create(user=user, name=f"{label} token")[0]


# How to make a row of each workspace-scoped model in a given workspace.
WORKSPACE_SCOPED = {
    Workspace: lambda workspace, label: workspace,
    Document: lambda workspace, label: make_document(workspace, title=f"{label} report"),
    Entity: _entity,
    Relation: _relation,
    EntityAlias: _alias,
    MergeLog: _merge_log,
    EvaluationSet: _evaluation_set,
    EvaluationRun: _evaluation_run,
    Conversation: _conversation,
    # Not workspace data: a staff user sees their own tokens, and another user's never.
    ApiToken: _token,
}


def _site_wide() -> set[type[Model]]:
    """Site-wide records: no workspace, visible only with the model's own permission."""
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog

    return {get_user_model(), Group, AccessAttempt, AccessLog, AccessFailureLog}


@pytest.fixture
def staff(client, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    user = make_user("staff", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label__in=["knowledge", "chat"]))
    stranger = make_user("stranger")
    mine = make_workspace(slug="mine", name="Mine", members={user: Role.OWNER})
    theirs = make_workspace(slug="theirs", name=THEIRS, members={stranger: Role.OWNER})
    client.force_login(user)
    return {"client": client, "user": user, "stranger": stranger, "mine": mine, "theirs": theirs}


def _url(obj: Model, view: str) -> str:
    meta = obj._meta
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_{view}", args=[obj.pk] if view == "change" else [])


def test_every_registered_model_admin_has_a_scoping_case():
    unknown = [
        f"{model._meta.label} ({type(model_admin).__name__})"
        for model, model_admin in admin.site._registry.items()
        if model not in WORKSPACE_SCOPED and model not in _site_wide()
    ]
    assert unknown == [], "say how these admins are scoped, here and in their ModelAdmin"


@pytest.mark.parametrize("model", list(WORKSPACE_SCOPED), ids=lambda model: model._meta.label)
def test_it_shows_filters_and_offers_only_rows_of_the_staff_users_workspaces(staff, model):
    client = staff["client"]
    mine = WORKSPACE_SCOPED[model](staff["mine"], "Mine")
    theirs = WORKSPACE_SCOPED[model](staff["theirs"], "Theirs")

    changelist = client.get(_url(mine, "changelist"))
    page = changelist.content.decode()
    assert changelist.status_code == 200
    assert _url(mine, "change") in page
    assert _url(theirs, "change") not in page
    assert THEIRS not in page  # not in a list filter either
    assert "stranger" not in page

    assert client.get(_url(theirs, "change")).status_code == 302  # "does not exist", back to the index
    change = client.get(_url(mine, "change"))
    assert change.status_code == 200
    for name, field in change.context["adminform"].form.fields.items():
        choices = getattr(field, "queryset", None)
        if choices is None:
            continue
        offered = {str(choice) for choice in choices}
        assert THEIRS not in offered, f"{model._meta.label}.{name} offers another team's workspace"
        assert "stranger" not in offered, f"{model._meta.label}.{name} offers a user from another team"
        assert all(getattr(choice, "workspace_id", staff["mine"].pk) == staff["mine"].pk for choice in choices), (
            f"{model._meta.label}.{name} offers rows of another workspace"
        )


@pytest.mark.parametrize("model", sorted(_site_wide(), key=str), ids=lambda model: model._meta.label)
def test_it_keeps_site_wide_records_from_staff_without_their_permission(staff, model):
    meta = model._meta
    response = staff["client"].get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))

    assert response.status_code == 403


def _autocomplete_fields() -> list[tuple[Model, str]]:
    fields = []
    for model, model_admin in admin.site._registry.items():
        for owner in [model_admin, *model_admin.inlines]:
            owner_model = owner.model if hasattr(owner, "model") and owner is not model_admin else model
            fields.extend((owner_model, name) for name in owner.autocomplete_fields)
    return fields


@pytest.mark.parametrize("source", _autocomplete_fields(), ids=lambda source: f"{source[0]._meta.label}.{source[1]}")
def test_every_autocomplete_is_scoped_or_needs_the_site_wide_permission(staff, source):
    model, field_name = source
    target = model._meta.get_field(field_name).related_model
    response = staff["client"].get(
        reverse("admin:autocomplete"),
        {"app_label": model._meta.app_label, "model_name": model._meta.model_name, "field_name": field_name},
    )

    if target in _site_wide():
        assert response.status_code == 403
    else:
        assert response.status_code == 200
        assert THEIRS not in response.content.decode()


def test_a_superuser_sees_every_workspace(client, staff):
    admin_user = make_user("root", is_staff=True, is_superuser=True)
    client.force_login(admin_user)

    page = client.get(reverse("admin:knowledge_workspace_changelist")).content.decode()

    assert THEIRS in page
    assert "Mine" in page


def test_revoking_a_token_in_the_admin_refuses_it_on_the_next_request(staff):
    token, secret = api_token_create(user=staff["user"], name="bot")

    response = staff["client"].post(
        reverse("admin:knowledge_apitoken_changelist"),
        {"action": "revoke", admin.helpers.ACTION_CHECKBOX_NAME: [token.pk]},
    )

    assert response.status_code == 302
    from knowledge.services.api_tokens import api_token_authenticate

    assert api_token_authenticate(secret) is None
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
