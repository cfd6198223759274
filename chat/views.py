from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from chat import selectors, services
from chat.forms import MODES, MODES_NEEDING_A_MODEL, RESPONSE_TYPES, AnswerSettingsForm, RenameForm
from chat.models import Message
from chat.rendering import prepare_message
from knowledge.rag.answer import answer_is_extractive
from knowledge.rag.retrieval import DEFAULT_MODE
from knowledge.selectors import document_tags, documents_for_picking, workspace_for_user
from knowledge.services.answers import FeedbackInvalid, feedback_give
from knowledge.services.asking import QUESTION_MAX_CHARS, TOP_K_MAX

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
    feedback = selectors.feedback_by_message(messages=messages, user=request.user)
    for message in messages:
        prepare_message(message, workspace=workspace)
        # Answers recorded by the ask service take feedback; older ones have no record to rate.
        message.takes_feedback = message.pk in feedback
        message.feedback = feedback.get(message.pk)
    answers = [
        {
            "id": m.pk,
            "subgraph": m.subgraph,
            "citations": m.citations,
            "keywords": m.keywords,
            "content": m.content,
        }
        for m in messages
        if m.role == Message.Role.ASSISTANT
    ]
    conversations = selectors.conversations_for_user(workspace=workspace, user=request.user)
    extractive = answer_is_extractive()
    preferences = selectors.chat_preferences_for(user=request.user)
    if extractive and preferences.mode in MODES_NEEDING_A_MODEL:
        preferences.mode = DEFAULT_MODE
    return render(
        request,
        "chat/chat.html",
        {
            "workspace": workspace,
            "conversation": conversation,
            "chat_messages": messages,
            "answers": answers,
            "conversations": conversations[:SIDEBAR_CONVERSATIONS],
            "modes": [
                {"mode": mode, "unavailable": MODES_NEEDING_A_MODEL.get(mode.value, "") if extractive else ""}
                for mode in MODES
            ],
            "preferences": preferences,
            "response_types": RESPONSE_TYPES,
            "top_k_max": TOP_K_MAX,
            "question_max_chars": QUESTION_MAX_CHARS,
            "extractive": extractive,
            "scope": _scope_picker(workspace, conversation),
            "blank_answer": Message(role=Message.Role.ASSISTANT, mode=preferences.mode, extractive=extractive),
            "blank_question": Message(role=Message.Role.USER),
            "client_config": {
                "socketPath": f"/ws/workspaces/{workspace.slug}/chat/",
                "conversation": conversation.pk if conversation else None,
                "conversationUrl": reverse("chat:conversation", args=[workspace.slug, 0]),
                "neighboursUrl": reverse("chat:neighbours", args=[workspace.slug]),
                "documentUrl": reverse("knowledge:document", args=[workspace.slug, 0]),
                "preferencesUrl": reverse("chat:preferences", args=[workspace.slug]),
                "feedbackUrl": reverse("chat:feedback", args=[workspace.slug, 0]),
                "extractive": extractive,
            },
        },
    )


def _scope_picker(workspace, conversation) -> dict:
    """What the scope picker offers (the workspace's tags and documents) and what the
    conversation last asked in."""
    chosen = conversation.scope if conversation else {}
    return {
        "tags": document_tags(workspace=workspace),
        "documents": documents_for_picking(workspace=workspace),
        "chosen_tags": chosen.get("tags", []),
        "chosen_documents": chosen.get("documents", []),
    }


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


@login_required
@require_POST
def preferences_save(request, slug):
    """Remember the chat settings the user just changed (the chat page posts them on change).
    They are the user's, not the workspace's; the workspace only gates who may post."""
    workspace_for_user(request.user, slug)
    form = AnswerSettingsForm(request.POST)
    if not form.is_valid():
        return JsonResponse({"error": form.first_error()}, status=400)
    services.chat_preferences_save(user=request.user, **form.cleaned_data)
    return HttpResponse(status=204)


@login_required
@require_http_methods(["GET", "POST"])
def answer_feedback(request, slug, message_id):
    """Thumbs up or down on an answer, with an optional comment (templates/chat/_feedback.html,
    posted with htmx; a plain form post comes back to the conversation)."""
    workspace = workspace_for_user(request.user, slug)
    answer = selectors.answer_for_message(workspace=workspace, user=request.user, message_id=message_id)
    feedback, error = selectors.feedback_of(answer=answer, user=request.user), ""
    if request.method == "POST":
        try:
            feedback = feedback_give(
                answer=answer, user=request.user, rating=request.POST.get("rating"), comment=request.POST.get("comment")
            )
        except FeedbackInvalid as invalid:
            error = str(invalid)
        if not request.htmx:
            return redirect("chat:conversation", slug=workspace.slug, conversation_id=answer.conversation_id)
    context = {"workspace": workspace, "message_id": answer.message_id, "feedback": feedback, "feedback_error": error}
    return render(request, "chat/_feedback.html", context, status=400 if error else 200)
