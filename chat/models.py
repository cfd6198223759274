from django.conf import settings
from django.db import models
from django.db.models import Q

from knowledge.models import Workspace


class ConversationQuerySet(models.QuerySet):
    def visible_to(self, user):
        """A user's own conversations plus the ones shared inside the workspace."""
        return self.filter(Q(user=user) | Q(shared=True))


class Conversation(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="conversations")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, default="New conversation")
    shared = models.BooleanField(default=False, help_text="Visible to every member of the workspace.")
    # The documents its questions read, as the scope picker last sent them:
    # {"tags": [...], "documents": [ids]}; empty: every enabled document.
    scope = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField()
    mode = models.CharField(max_length=10, blank=True)
    extractive = models.BooleanField(default=False, help_text="Answered without a language model.")
    stopped = models.BooleanField(default=False, help_text="Stopped before the end; the content is the partial answer.")
    keywords = models.JSONField(default=dict, blank=True)
    citations = models.JSONField(default=list, blank=True)
    subgraph = models.JSONField(default=dict, blank=True)
    usage = models.JSONField(default=dict, blank=True, help_text="Prompt and completion tokens, model calls.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:50]}"


class ChatPreferences(models.Model):
    """The chat settings a user last chose (mode, how much to retrieve, the answer's form), so
    every conversation starts with them."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_preferences")
    mode = models.CharField(max_length=10, default="mix")
    top_k = models.PositiveIntegerField(default=40)
    chunk_top_k = models.PositiveIntegerField(default=20)
    response_type = models.CharField(max_length=40, default="Multiple Paragraphs")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "chat preferences"

    def __str__(self) -> str:
        return f"chat preferences of {self.user}"
