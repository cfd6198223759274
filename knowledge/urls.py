from django.urls import include, path

from knowledge import api, ollama_api, openai_api, views

# Everything inside a workspace lives under the `knowledge` namespace; `home` stays global
# because settings (LOGIN_REDIRECT_URL) and base.html name it.
workspace_patterns = [
    path("workspaces/new/", views.workspace_new, name="workspace_new"),
    path("workspaces/<slug:slug>/", views.workspace, name="workspace"),
    path("workspaces/<slug:slug>/documents/", views.documents, name="documents"),
    path("workspaces/<slug:slug>/documents/upload/", views.upload, name="upload"),
    path("workspaces/<slug:slug>/documents/delete/", views.documents_delete, name="documents_delete"),
    path("workspaces/<slug:slug>/documents/<int:pk>/", views.document, name="document"),
    path("workspaces/<slug:slug>/documents/<int:pk>/retry/", views.document_retry, name="document_retry"),
    path("workspaces/<slug:slug>/documents/<int:pk>/delete/", views.document_delete, name="document_delete"),
    path("workspaces/<slug:slug>/entities/", views.entities, name="entities"),
    path("workspaces/<slug:slug>/entities/<int:pk>/", views.entity, name="entity"),
    path("workspaces/<slug:slug>/graph/", views.graph, name="graph"),
    path("workspaces/<slug:slug>/graph.json", views.graph_json, name="graph_json"),
    path("workspaces/<slug:slug>/graph/export/<str:format>/", views.graph_export, name="graph_export"),
    path("workspaces/<slug:slug>/members/", views.members, name="members"),
    path("workspaces/<slug:slug>/members/add/", views.member_add, name="member_add"),
    path("workspaces/<slug:slug>/members/<int:pk>/role/", views.member_role, name="member_role"),
    path("workspaces/<slug:slug>/members/<int:pk>/remove/", views.member_remove, name="member_remove"),
    path("workspaces/<slug:slug>/settings/", views.workspace_settings, name="settings"),
    path("workspaces/<slug:slug>/delete/", views.workspace_delete, name="workspace_delete"),
    path("workspaces/<slug:slug>/audit/", views.audit, name="audit"),
    path("api/workspaces/<slug:slug>/query", api.query, name="api_query"),
    # OpenAI's and Ollama's paths, where their clients look for them.
    path("v1/models", openai_api.models, name="openai_models"),
    path("v1/chat/completions", openai_api.chat_completions, name="openai_chat_completions"),
    path("api/version", ollama_api.version, name="ollama_version"),
    path("api/tags", ollama_api.tags, name="ollama_tags"),
    path("api/chat", ollama_api.chat, name="ollama_chat"),
    path("api/generate", ollama_api.generate, name="ollama_generate"),
    path("", include("knowledge.evaluation.urls")),
]

urlpatterns = [
    path("", views.home, name="home"),
    path("", include((workspace_patterns, "knowledge"))),
]
