from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import Count, QuerySet
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from knowledge.models import (
    ApiToken,
    Document,
    Entity,
    EntityAlias,
    EntitySource,
    EvaluationAnswer,
    EvaluationJudgement,
    EvaluationQuestion,
    EvaluationRun,
    EvaluationSet,
    Membership,
    MergeLog,
    Relation,
    Role,
    Workspace,
)
from knowledge.selectors import relations_of_entity, roles_at_least, workspaces_for_user
from knowledge.services import events, ingestion
from knowledge.services.api_tokens import api_token_revoke
from knowledge.services.curation import (
    DUPLICATE_CANDIDATES,
    CurationError,
    check_entity_name,
    entity_merge,
    entity_merge_undo,
    entity_update,
    possible_duplicates,
)

# --- Scoping: every admin row, filter choice and related choice comes from the workspaces the
# staff user holds a role in (superusers: all). A new ModelAdmin must say how it is scoped:
# tests/knowledge/test_admin_scoping.py walks the registry and fails for one without a case.


def workspaces_with_role(user, min_role: str) -> QuerySet[Workspace]:
    """Workspaces where this user holds at least `min_role` (superusers: every one)."""
    if user.is_superuser:
        return Workspace.objects.all()
    return workspaces_for_user(user).filter(role__in=roles_at_least(min_role))


def curatable_workspaces(user) -> QuerySet[Workspace]:
    """Workspaces whose graph this user may curate: editor or owner (superusers: every one)."""
    return workspaces_with_role(user, Role.EDITOR)


def scoped_choices(model, workspaces: QuerySet[Workspace]) -> QuerySet | None:
    """The rows of `model` a form may offer for these workspaces; None for a model outside them."""
    if model is Workspace:
        return workspaces
    if any(field.name == "workspace" for field in model._meta.get_fields()):
        return model._default_manager.filter(workspace__in=workspaces.values("pk"))
    if model is get_user_model():
        # People are offered only as fellow members, so a form never lists everyone's usernames.
        return model._default_manager.filter(memberships__workspace__in=workspaces.values("pk")).distinct()
    return None


class WorkspaceFilter(admin.SimpleListFilter):
    """The workspace filter, listing only the workspaces the admin is scoped to (names do not leak)."""

    title = "workspace"
    parameter_name = "workspace__id__exact"

    def lookups(self, request, model_admin):
        return [(workspace.pk, workspace.name) for workspace in model_admin.workspaces(request).order_by("name")]

    def queryset(self, request, queryset):
        return queryset.filter(workspace_id=self.value()) if self.value() else queryset


class WorkspaceScopedAdmin(admin.ModelAdmin):
    """Rows of the workspaces where the staff user holds `min_role`; foreign-key choices (and
    so the related-object links next to them) from those workspaces only."""

    # The lookup from a row to its workspace; "" when the row is a workspace.
    workspace_field = "workspace"
    min_role = Role.EDITOR

    def workspaces(self, request) -> QuerySet[Workspace]:
        return workspaces_with_role(request.user, self.min_role)

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        lookup = f"{self.workspace_field}__in" if self.workspace_field else "pk__in"
        return queryset.filter(**{lookup: self.workspaces(request).values("pk")})

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        choices = (
            None if request.user.is_superuser else scoped_choices(db_field.related_model, self.workspaces(request))
        )
        if choices is not None:
            kwargs["queryset"] = choices
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    # Any user may be added (as on the members page); the search behind it is the user admin's,
    # which needs the site-wide permission to view users.
    autocomplete_fields = ["user"]


@admin.register(Workspace)
class WorkspaceAdmin(WorkspaceScopedAdmin):
    """Staff given model permissions still only see the workspaces they own."""

    workspace_field = ""
    min_role = Role.OWNER
    list_display = [
        "name",
        "slug",
        "chunk_count",
        "entity_count",
        "relation_count",
        "created_at",
    ]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["chunk_count", "entity_count", "relation_count"]
    inlines = [MembershipInline]

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        # Memberships edited here bypass the membership services: open sockets check theirs again.
        events.publish_membership_changed(workspace_id=form.instance.pk)


@admin.register(Document)
class DocumentAdmin(WorkspaceScopedAdmin):
    """Documents arrive through the upload page and leave through the deletion service, as in the
    browser: Django's cascade would leave orphan entities and relations published with stale
    descriptions and degrees, no rebuild, audit row, file removal or count refresh. Staff may
    rename a document; its status, stage, lease, counters and workspace belong to its run."""

    list_display = [
        "title",
        "workspace",
        "status",
        "chunk_count",
        "entity_count",
        "relation_count",
        "created_at",
    ]
    list_filter = ["status", WorkspaceFilter]
    search_fields = ["title", "original_filename"]
    readonly_fields = [field.name for field in Document._meta.concrete_fields if field.name not in ("id", "title")]

    def has_add_permission(self, request):
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        if "delete_selected" in actions:
            function, name, _ = actions["delete_selected"]
            actions[name] = (function, name, "Delete selected documents and what the graph learned only from them")
        return actions

    def get_deleted_objects(self, objs, request):
        # The cascade below a document (chunks, provenance, vectors) is the service's to delete;
        # listing it would also ask staff for delete permissions on every table it touches.
        documents = list(objs)
        return [str(document) for document in documents], {"documents": len(documents)}, set(), []

    def delete_model(self, request, obj):
        ingestion.document_delete(document=obj, actor=request.user, rebuild_now=False)

    def delete_queryset(self, request, queryset):
        by_workspace: dict[int, list[Document]] = {}
        for document in queryset.select_related("workspace").defer("text"):
            by_workspace.setdefault(document.workspace_id, []).append(document)
        for documents in by_workspace.values():
            ingestion.documents_delete(documents=documents, actor=request.user, rebuild_now=False)


# --- Curation (issue 6): scoped to the workspaces where the staff user is editor or owner ------


class CurationAdmin(WorkspaceScopedAdmin):
    """Visible to staff who are editor or owner somewhere; rows limited to those workspaces.

    The graph changes only through services (merge, undo, edit), never by adding or deleting
    rows here: provenance and counts would drift from what the documents say.
    """

    def _may_curate(self, request) -> bool:
        user = request.user
        return user.is_active and user.is_staff and curatable_workspaces(user).exists()

    def has_module_permission(self, request):
        return self._may_curate(request)

    def has_view_permission(self, request, obj=None):
        return self._may_curate(request)

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class EntitySourceInline(admin.TabularInline):
    model = EntitySource
    verbose_name_plural = "provenance (the chunks this entity was extracted from)"
    fields = ["source_chunk", "name", "type", "description"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("chunk__document").defer("chunk__embedding")

    def has_view_permission(self, request, obj=None):
        # Whoever may open the entity (scoped by EntityAdmin) may see where it came from.
        return True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="chunk")
    def source_chunk(self, source):
        document = source.chunk.document
        url = reverse("knowledge:document", args=[document.workspace.slug, document.pk])
        return format_html(
            '<a href="{}?chunk={}#chunk-{}">{} · chunk {}</a>',
            url,
            source.chunk_id,
            source.chunk_id,
            document.title,
            source.chunk.order + 1,
        )


class EntityAdminForm(forms.ModelForm):
    class Meta:
        model = Entity
        fields = ["name", "type", "description"]

    def clean_name(self):
        name = self.cleaned_data["name"]
        try:
            check_entity_name(entity=self.instance, name=name)
        except CurationError as err:
            raise forms.ValidationError(str(err)) from err
        return name


class MergeForm(forms.Form):
    survivor = forms.ModelChoiceField(queryset=Entity.objects.none(), widget=forms.RadioSelect, empty_label=None)

    def __init__(self, *args, entities, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["survivor"].queryset = entities
        self.fields["survivor"].label_from_instance = lambda entity: f"{entity.name} ({entity.type or 'no type'})"


@admin.register(Entity)
class EntityAdmin(CurationAdmin):
    form = EntityAdminForm
    list_display = ["name", "type", "workspace", "source_count", "updated_at"]
    list_filter = [WorkspaceFilter, "type"]
    search_fields = ["name", "key", "description", "aliases__name"]
    readonly_fields = ["workspace", "key", "alias_names", "relations_table", "created_at", "updated_at"]
    fields = ["workspace", "name", "key", "type", "description", "alias_names", "relations_table"]
    inlines = [EntitySourceInline]
    actions = ["merge_into"]
    list_select_related = ["workspace"]
    change_list_template = "admin/knowledge/entity/change_list.html"

    def get_queryset(self, request):
        return super().get_queryset(request).defer("embedding").annotate(source_count=Count("sources"))

    def has_change_permission(self, request, obj=None):
        return self._may_curate(request)

    @admin.display(description="sources", ordering="source_count")
    def source_count(self, entity):
        return entity.source_count

    @admin.display(description="aliases")
    def alias_names(self, entity):
        return ", ".join(entity.aliases.order_by("name").values_list("name", flat=True)) or "—"

    @admin.display(description="relations")
    def relations_table(self, entity):
        rows = relations_of_entity(entity=entity)
        if not rows:
            return "—"
        return format_html(
            "<table><tr><th>with</th><th>keywords</th><th>weight</th><th>description</th></tr>{}</table>",
            format_html_join(
                "",
                '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>',
                (
                    (
                        reverse("admin:knowledge_entity_change", args=[relation.other.pk]),
                        relation.other.name,
                        relation.keywords,
                        f"{relation.weight:g}",
                        relation.description,
                    )
                    for relation in rows
                ),
            ),
        )

    def save_model(self, request, obj, form, change):
        # The form checked the name; the service renames (keeping the old name as an alias),
        # re-embeds and writes the audit log.
        data = form.cleaned_data
        entity_update(
            entity=obj, actor=request.user, name=data["name"], type=data["type"], description=data["description"]
        )

    def get_urls(self):
        return [
            path("duplicates/", self.admin_site.admin_view(self.duplicates_view), name="knowledge_entity_duplicates"),
            path("merge/", self.admin_site.admin_view(self.merge_view), name="knowledge_entity_merge"),
            *super().get_urls(),
        ]

    @admin.action(description="Merge selected entities into…")
    def merge_into(self, request, queryset):
        return self._merge_page(request, queryset)

    def merge_view(self, request):
        """The one-click merge of the duplicates page, and the confirmation step of the action."""
        if request.method != "POST":
            return redirect("admin:knowledge_entity_changelist")
        ids = request.POST.getlist("_selected_action")
        return self._merge_page(request, self.get_queryset(request).filter(pk__in=ids))

    def _merge_page(self, request, queryset):
        entities = queryset.select_related("workspace").order_by("name")
        if len({entity.workspace_id for entity in entities}) != 1 or len(entities) < 2:
            self.message_user(request, "Select two or more entities of one workspace to merge.", messages.ERROR)
            return redirect("admin:knowledge_entity_changelist")
        form = MergeForm(request.POST if "apply" in request.POST else None, entities=queryset)
        if form.is_valid():
            survivor = form.cleaned_data["survivor"]
            try:
                log = entity_merge(
                    survivor=survivor, others=[e for e in entities if e.pk != survivor.pk], actor=request.user
                )
            except CurationError as err:
                self.message_user(request, str(err), messages.ERROR)
            else:
                undo = reverse("admin:knowledge_mergelog_undo", args=[log.pk])
                self.message_user(
                    request,
                    format_html(
                        "Merged {} into {}. <a href='{}'>Undo this merge</a>",
                        ", ".join(log.merged_names),
                        log.survivor_name,
                        undo,
                    ),
                    messages.SUCCESS,
                )
                if "duplicates" in request.POST:
                    query = urlencode({key: request.POST.get(key, "") for key in ("workspace", "name", "cosine")})
                    return redirect(f"{reverse('admin:knowledge_entity_duplicates')}?{query}")
                return redirect("admin:knowledge_entity_change", survivor.pk)
        context = {
            **self.admin_site.each_context(request),
            "title": "Merge entities",
            "opts": self.model._meta,
            "entities": entities,
            "form": form,
        }
        return TemplateResponse(request, "admin/knowledge/entity/merge.html", context)

    def duplicates_view(self, request):
        workspaces = curatable_workspaces(request.user).order_by("name")
        workspace = workspaces.filter(pk=request.GET.get("workspace") or None).first() or workspaces.first()
        name_threshold = _threshold(request.GET.get("name"), DEFAULT_NAME_SIMILARITY)
        cosine_threshold = _threshold(request.GET.get("cosine"), DEFAULT_COSINE)
        pairs = (
            possible_duplicates(workspace=workspace, name_threshold=name_threshold, cosine_threshold=cosine_threshold)
            if workspace is not None
            else []
        )
        context = {
            **self.admin_site.each_context(request),
            "title": "Possible duplicates",
            "opts": self.model._meta,
            "workspaces": workspaces,
            "workspace": workspace,
            "pairs": pairs,
            "name_threshold": name_threshold,
            "cosine_threshold": cosine_threshold,
            "candidates": DUPLICATE_CANDIDATES,
        }
        return TemplateResponse(request, "admin/knowledge/entity/duplicates.html", context)


DEFAULT_NAME_SIMILARITY = 0.85
DEFAULT_COSINE = 0.92


def _threshold(raw: str | None, default: float) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return default
    return min(max(value, 0.5), 1.0)


@admin.register(Relation)
class RelationAdmin(CurationAdmin):
    list_display = ["source", "target", "weight", "keywords", "workspace"]
    list_filter = [WorkspaceFilter]
    search_fields = ["source__name", "target__name", "keywords"]
    exclude = ["embedding"]
    list_select_related = ["source", "target", "workspace"]


@admin.register(EntityAlias)
class EntityAliasAdmin(CurationAdmin):
    list_display = ["name", "entity", "workspace", "created_at"]
    list_filter = [WorkspaceFilter]
    search_fields = ["name", "entity__name"]
    list_select_related = ["entity", "workspace"]


@admin.register(MergeLog)
class MergeLogAdmin(CurationAdmin):
    list_display = ["created_at", "survivor_name", "merged", "workspace", "user", "undone_at", "undo_link"]
    list_filter = [WorkspaceFilter]
    search_fields = ["survivor_name"]
    exclude = ["snapshot"]
    readonly_fields = ["snapshot_summary"]
    list_select_related = ["workspace", "user"]
    actions = ["undo_merges"]

    def get_queryset(self, request):
        return super().get_queryset(request).defer("snapshot")

    @admin.display(description="merged")
    def merged(self, log):
        return ", ".join(log.merged_names)

    @admin.display(description="")
    def undo_link(self, log):
        if log.undone_at is not None:
            return "undone"
        return format_html('<a href="{}">Undo…</a>', reverse("admin:knowledge_mergelog_undo", args=[log.pk]))

    @admin.display(description="what undo restores")
    def snapshot_summary(self, log):
        snapshot = MergeLog.objects.only("snapshot").get(pk=log.pk).snapshot
        return ", ".join(f"{len(snapshot.get(part, []))} {part.replace('_', ' ')}" for part in SNAPSHOT_PARTS)

    def get_urls(self):
        undo = self.admin_site.admin_view(self.undo_view)
        return [path("<int:pk>/undo/", undo, name="knowledge_mergelog_undo"), *super().get_urls()]

    def undo_view(self, request, pk):
        log = get_object_or_404(self.get_queryset(request), pk=pk)
        if request.method == "POST":
            self._undo(request, log)
            return redirect("admin:knowledge_mergelog_changelist")
        context = {**self.admin_site.each_context(request), "title": "Undo merge", "opts": self.model._meta, "log": log}
        return TemplateResponse(request, "admin/knowledge/mergelog/undo.html", context)

    @admin.action(description="Undo selected merges (newest first)")
    def undo_merges(self, request, queryset):
        for log in queryset.order_by("-pk"):
            self._undo(request, log)

    def _undo(self, request, log):
        try:
            entity_merge_undo(merge_log=log, actor=request.user)
        except CurationError as err:
            self.message_user(request, f"{log}: {err}", messages.ERROR)
        else:
            names = ", ".join(log.merged_names)
            self.message_user(request, f"Split {names} back out of {log.survivor_name}.", messages.SUCCESS)


SNAPSHOT_PARTS = ("entities", "relations", "entity_sources", "relation_sources", "aliases")


# --- Evaluation (issue 7): question sets are edited here; runs are read-only records ---------


class EvaluationQuestionInline(admin.TabularInline):
    model = EvaluationQuestion
    extra = 1
    fields = ["order", "text", "persona", "task"]


@admin.register(EvaluationSet)
class EvaluationSetAdmin(WorkspaceScopedAdmin):
    list_display = ["name", "workspace", "question_count", "created_at"]
    list_filter = [WorkspaceFilter]
    search_fields = ["name", "questions__text"]
    readonly_fields = ["generation", "created_by", "created_at"]
    inlines = [EvaluationQuestionInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(question_total=Count("questions"))

    @admin.display(description="questions", ordering="question_total")
    def question_count(self, evaluation_set) -> int:
        return evaluation_set.question_total


class EvaluationAnswerInline(admin.TabularInline):
    model = EvaluationAnswer
    extra = 0
    can_delete = False
    fields = ["question", "system", "text", "prompt_tokens", "completion_tokens", "llm_calls", "error"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class EvaluationJudgementInline(admin.TabularInline):
    model = EvaluationJudgement
    extra = 0
    can_delete = False
    fields = ["question", "order", "verdicts", "error"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(EvaluationRun)
class EvaluationRunAdmin(WorkspaceScopedAdmin):
    list_display = ["__str__", "workspace", "evaluation_set", "status", "judge_model", "created_at"]
    list_filter = [WorkspaceFilter, "status"]
    readonly_fields = [
        "workspace",
        "evaluation_set",
        "system_a",
        "system_b",
        "answer_model",
        "judge_model",
        "status",
        "error",
        "summary",
        "created_by",
        "created_at",
        "finished_at",
    ]
    inlines = [EvaluationAnswerInline, EvaluationJudgementInline]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are made with `manage.py create_api_token`, the only place their secret is ever
    shown. Staff see their own tokens (superusers: everyone's); revoking keeps the row."""

    list_display = ["name", "user", "scope", "created_at", "expires_at", "revoked_at", "last_used_at", "last_used_ip"]
    list_filter = ["scope"]
    list_select_related = ["user"]
    search_fields = ["name", "user__username"]
    readonly_fields = [
        "user",
        "name",
        "scope",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
        "last_used_ip",
    ]
    exclude = ["token_hash"]
    actions = ["revoke"]

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        return queryset if request.user.is_superuser else queryset.filter(user=request.user)

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke selected tokens (refused from the next request on)")
    def revoke(self, request, queryset):
        for token in queryset:
            api_token_revoke(token=token)
        self.message_user(request, f"Revoked {len(queryset)} token(s).", messages.SUCCESS)
