from django.contrib import admin

from chat.models import Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ["role", "mode", "content", "created_at"]
    readonly_fields = fields


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["title", "workspace", "user", "shared", "updated_at"]
    list_filter = ["workspace", "shared"]
    inlines = [MessageInline]
