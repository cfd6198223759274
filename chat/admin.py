from django.contrib import admin

from chat.models import Conversation, Message
from knowledge.admin import WorkspaceFilter, WorkspaceScopedAdmin
from knowledge.models import Role


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ["role", "mode", "content", "created_at"]
    readonly_fields = fields


@admin.register(Conversation)
class ConversationAdmin(WorkspaceScopedAdmin):
    """What the chat shows the staff user: their own conversations and the shared ones, in the
    workspaces they belong to (superusers: all)."""

    min_role = Role.VIEWER
    list_display = ["title", "workspace", "user", "shared", "updated_at"]
    list_filter = [WorkspaceFilter, "shared"]
    inlines = [MessageInline]

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        return queryset if request.user.is_superuser else queryset.visible_to(request.user)
