from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from chat import selectors, services
from chat.forms import (
    MODES,
    MODES_NEEDING_A_MODEL,
    RESPONSE_TYPES,
    AnswerSettingsForm,
    RenameForm,
    answer_settings,
)
from chat.models import Message
from chat.rendering import prepare_message, sources_context
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
    answers = [message for message in messages if message.role == Message.Role.ASSISTANT]
    conversations = selectors.conversations_for_user(workspace=workspace, user=request.user)
    extractive = answer_is_extractive()
    preferences = selectors.chat_preferences_for(user=request.user)
    return render(
        request,
        "chat/chat.html",
        {
            **_settings_context(workspace, preferences, extractive),
            "conversation": conversation,
            "chat_messages": messages,
            # The panel shows the latest answer's sources until another answer is picked.
            **sources_context(message=answers[-1] if answers else Message(), workspace=workspace),
            "conversations": conversations[:SIDEBAR_CONVERSATIONS],
            "question_max_chars": QUESTION_MAX_CHARS,
            "scope": _scope_picker(workspace, conversation),
            "client_config": {
                "neighboursUrl": reverse("chat:neighbours", args=[workspace.slug]),
            },
        },
    )


def _settings_context(workspace, preferences, extractive: bool) -> dict:
    """What chat/_settings.html needs: the modes (with the reason one is off) and the settings
    that change something in the chosen mode."""
    if extractive and preferences.mode in MODES_NEEDING_A_MODEL:
        preferences.mode = DEFAULT_MODE
    settings = answer_settings(mode=preferences.mode, extractive=extractive)
    return {
        "workspace": workspace,
        "modes": [
            {"mode": mode, "unavailable": MODES_NEEDING_A_MODEL.get(mode.value, "") if extractive else ""}
            for mode in MODES
        ],
        "preferences": preferences,
        "shown_settings": {setting.name for setting in settings if not setting.unused},
        "unused_settings": [setting for setting in settings if setting.unused],
        "response_types": RESPONSE_TYPES,
        "top_k_max": TOP_K_MAX,
        "extractive": extractive,
    }


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
    workspace = workspace_for_user(request.user, slug)
    form = AnswerSettingsForm(request.POST)
    valid = form.is_valid()
    mode_before = selectors.chat_preferences_for(user=request.user).mode
    if valid:
        # A setting the page does not show is not posted, and keeps its saved value.
        changed = {name: value for name, value in form.cleaned_data.items() if name in request.POST}
        services.chat_preferences_save(user=request.user, **changed)
    if not request.htmx:
        return HttpResponse(status=204) if valid else JsonResponse({"error": form.first_error()}, status=400)
    # The settings again, for the mode now chosen (or as they were, with the error, when refused).
    context = _settings_context(workspace, selectors.chat_preferences_for(user=request.user), answer_is_extractive())
    context.update(settings_saved=valid, settings_error="" if valid else form.first_error())
    response = render(request, "chat/_settings.html", context)
    if valid and context["preferences"].mode == mode_before:
        # The same settings stay on the page: only the status line changes, and a field the reader
        # is already typing in is not swapped from under them.
        response["HX-Reswap"] = "none"
    return response


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


@login_required
def answer_sources(request, slug, message_id):
    """The sources panel of one answer of the conversation (its "Show sources" button)."""
    workspace = workspace_for_user(request.user, slug)
    message = selectors.answer_message_for_user(workspace=workspace, user=request.user, message_id=message_id)
    return render(
        request, "chat/_sources.html", {"workspace": workspace, **sources_context(message=message, workspace=workspace)}
    )
