"""The API's HTTP paths; config/urls.py mounts them with the pages under the `knowledge` namespace.
The MCP server is an ASGI app of its own, routed in config/asgi.py."""

from django.urls import path

from knowledge.api import http, ollama, openai

urlpatterns = [
    path("api/workspaces/<slug:slug>/query", http.query, name="api_query"),
    path("api/workspaces/<slug:slug>/documents", http.documents, name="api_documents"),
    path("api/workspaces/<slug:slug>/documents/<int:pk>", http.document, name="api_document"),
    path(
        "api/workspaces/<slug:slug>/answers/<str:answer_id>/feedback", http.answer_feedback, name="api_answer_feedback"
    ),
    # OpenAI's and Ollama's paths, where their clients look for them.
    path("v1/models", openai.models, name="openai_models"),
    path("v1/chat/completions", openai.chat_completions, name="openai_chat_completions"),
    path("v1/chat/completions/<str:completion_id>", openai.completion, name="openai_completion"),
    path("api/version", ollama.version, name="ollama_version"),
    path("api/tags", ollama.tags, name="ollama_tags"),
    path("api/ps", ollama.ps, name="ollama_ps"),
    path("api/chat", ollama.chat, name="ollama_chat"),
    path("api/generate", ollama.generate, name="ollama_generate"),
    path("api/feedback", ollama.feedback, name="ollama_feedback"),
]
