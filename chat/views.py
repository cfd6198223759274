from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from chat import selectors, services
from chat.forms import MODES, RenameForm
from chat.models import Message
from chat.rendering import render_answer
from knowledge.answer import answer_is_extractive
from knowledge.asking import QUESTION_MAX_CHARS
from knowledge.retrieval import DEFAULT_MODE
from knowledge.selectors import workspace_for_user

SIDEBAR_CONVERSATIONS = 15


@login_required
def chat_page(request, slug, conversation_id=None):
    workspace = workspace_for_user(request.user, slug)
    conversation = None
    messages = []
    if conversation_id is not None:
        conversation = selectors.conversation_for_user(
            workspace=workspace, user=request.user, conversation_id=conversation_id
        )
        messages = selectors.conversation_messages(conversation=conversation)
    for message in messages:
        if message.role == Message.Role.ASSISTANT:
            message.html = render_answer(message.content)
    answers = [
        {"id": m.pk, "subgraph": m.subgraph, "citations": m.citations, "keywords": m.keywords}
        for m in messages
        if m.role == Message.Role.ASSISTANT
    ]
    conversations = selectors.conversations_for_user(workspace=workspace, user=request.user)
    return render(
        request,
        "chat/chat.html",
        {
            "workspace": workspace,
            "conversation": conversation,
            "chat_messages": messages,
            "answers": answers,
            "conversations": conversations[:SIDEBAR_CONVERSATIONS],
            "modes": MODES,
            "default_mode": DEFAULT_MODE,
            "question_max_chars": QUESTION_MAX_CHARS,
            "extractive": answer_is_extractive(),
            "client_config": {
                "socketPath": f"/ws/workspaces/{workspace.slug}/chat/",
                "conversation": conversation.pk if conversation else None,
                "conversationUrl": reverse("chat:conversation", args=[workspace.slug, 0]),
                "neighboursUrl": reverse("chat:neighbours", args=[workspace.slug]),
                "documentUrl": reverse("knowledge:document", args=[workspace.slug, 0]),
                "extractive": answer_is_extractive(),
            },
        },
    )


@login_required
def conversation_list(request, slug):
    workspace = workspace_for_user(request.user, slug)
    conversations = selectors.conversations_for_user(workspace=workspace, user=request.user)
    return render(request, "chat/conversations.html", {"workspace": workspace, "conversations": conversations})


def _owned_conversation(request, slug, conversation_id):
    workspace = workspace_for_user(request.user, slug)
    conversation = selectors.conversation_for_user(
        workspace=workspace, user=request.user, conversation_id=conversation_id, owned=True
    )
    return workspace, conversation


def _conversation_fragment(request, workspace, conversation):
    """The part of the page the htmx request came from, or the list for a plain form post."""
    if not request.htmx:
        return redirect("chat:conversations", slug=workspace.slug)
    template = "chat/_conversation_header.html" if request.htmx.target == "conversation-header" else None
    conversation.message_count = conversation.messages.count()
    context = {"workspace": workspace, "conversation": conversation}
    return render(request, template or "chat/_conversation_row.html", context)


@login_required
@require_POST
def conversation_rename(request, slug, conversation_id):
    workspace, conversation = _owned_conversation(request, slug, conversation_id)
    form = RenameForm(request.POST)
    if form.is_valid():
        services.conversation_rename(conversation=conversation, title=form.cleaned_data["title"])
    return _conversation_fragment(request, workspace, conversation)


@login_required
@require_POST
def conversation_share(request, slug, conversation_id):
    workspace, conversation = _owned_conversation(request, slug, conversation_id)
    services.conversation_set_shared(conversation=conversation, shared=request.POST.get("shared") == "on")
    return _conversation_fragment(request, workspace, conversation)


@login_required
@require_POST
def conversation_delete(request, slug, conversation_id):
    workspace, conversation = _owned_conversation(request, slug, conversation_id)
    services.conversation_delete(conversation=conversation)
    if request.htmx and request.htmx.target == "conversation-header":
        response = HttpResponse(status=204)
        response["HX-Redirect"] = reverse("chat:new", args=[workspace.slug])
        return response
    if request.htmx:
        return HttpResponse("")
    return redirect("chat:conversations", slug=workspace.slug)


@login_required
def graph_neighbours(request, slug):
    """The neighbourhood of one entity, for the graph panel's double-click."""
    workspace = workspace_for_user(request.user, slug)
    return JsonResponse(selectors.entity_neighbours(workspace=workspace, entity_id=request.GET.get("entity")))
