from django.contrib import admin
from django.db.models import Count

from knowledge.models import (
    Document,
    Entity,
    EvaluationAnswer,
    EvaluationJudgement,
    EvaluationQuestion,
    EvaluationRun,
    EvaluationSet,
    Membership,
    Relation,
    Workspace,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
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


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = [
        "title",
        "workspace",
        "status",
        "chunk_count",
        "entity_count",
        "relation_count",
        "created_at",
    ]
    list_filter = ["status", "workspace"]
    search_fields = ["title", "original_filename"]
    readonly_fields = ["content_hash", "text"]


@admin.register(Entity)
class EntityAdmin(admin.ModelAdmin):
    list_display = ["name", "type", "workspace"]
    list_filter = ["workspace", "type"]
    search_fields = ["name", "key"]
    exclude = ["embedding"]


@admin.register(Relation)
class RelationAdmin(admin.ModelAdmin):
    list_display = ["source", "target", "weight", "workspace"]
    list_filter = ["workspace"]
    raw_id_fields = ["source", "target"]
    exclude = ["embedding"]


# --- Evaluation (issue 7): question sets are edited here; runs are read-only records ---------


class EvaluationQuestionInline(admin.TabularInline):
    model = EvaluationQuestion
    extra = 1
    fields = ["order", "text", "persona", "task"]


@admin.register(EvaluationSet)
class EvaluationSetAdmin(admin.ModelAdmin):
    list_display = ["name", "workspace", "question_count", "created_at"]
    list_filter = ["workspace"]
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
class EvaluationRunAdmin(admin.ModelAdmin):
    list_display = ["__str__", "workspace", "evaluation_set", "status", "judge_model", "created_at"]
    list_filter = ["workspace", "status"]
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
