from django.contrib import admin

from knowledge.models import Document, Entity, Membership, Relation, Workspace


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
