"""The pages of a workspace. config/urls.py mounts them, with the API's (knowledge/api/urls.py),
under the `knowledge` namespace."""

from django.urls import path

from knowledge.web import analytics, evaluation, model_settings, sources, views

urlpatterns = [
    path("workspaces/new/", views.workspace_new, name="workspace_new"),
    path("workspaces/<slug:slug>/", views.workspace, name="workspace"),
    path("workspaces/<slug:slug>/documents/", views.documents, name="documents"),
    path("workspaces/<slug:slug>/documents/upload/", views.upload, name="upload"),
    path("workspaces/<slug:slug>/documents/delete/", views.documents_delete, name="documents_delete"),
    path("workspaces/<slug:slug>/documents/<int:pk>/", views.document, name="document"),
    path("workspaces/<slug:slug>/documents/<int:pk>/retry/", views.document_retry, name="document_retry"),
    path("workspaces/<slug:slug>/documents/<int:pk>/delete/", views.document_delete, name="document_delete"),
    path("workspaces/<slug:slug>/documents/<int:pk>/label/", views.document_label, name="document_label"),
    path("workspaces/<slug:slug>/documents/<int:pk>/replace/", views.document_replace, name="document_replace"),
    path(
        "workspaces/<slug:slug>/documents/<int:pk>/prune/", views.document_version_prune, name="document_version_prune"
    ),
    path("workspaces/<slug:slug>/sources/", sources.sources, name="sources"),
    path("workspaces/<slug:slug>/sources/<int:pk>/", sources.source, name="source"),
    path("workspaces/<slug:slug>/sources/<int:pk>/sync/", sources.source_sync, name="source_sync"),
    path("workspaces/<slug:slug>/sources/<int:pk>/delete/", sources.source_delete, name="source_delete"),
    path("workspaces/<slug:slug>/entities/", views.entities, name="entities"),
    path("workspaces/<slug:slug>/entities/<int:pk>/", views.entity, name="entity"),
    path("workspaces/<slug:slug>/graph/", views.graph, name="graph"),
    path("workspaces/<slug:slug>/graph.json", views.graph_json, name="graph_json"),
    path("workspaces/<slug:slug>/graph/export/<str:format>/", views.graph_export, name="graph_export"),
    path("workspaces/<slug:slug>/members/", views.members, name="members"),
    path("workspaces/<slug:slug>/members/add/", views.member_add, name="member_add"),
    path("workspaces/<slug:slug>/members/<int:pk>/role/", views.member_role, name="member_role"),
    path("workspaces/<slug:slug>/members/<int:pk>/remove/", views.member_remove, name="member_remove"),
    path("workspaces/<slug:slug>/invitations/", views.invitation_create, name="invitation_create"),
    path("workspaces/<slug:slug>/invitations/<int:pk>/resend/", views.invitation_resend, name="invitation_resend"),
    path("workspaces/<slug:slug>/invitations/<int:pk>/revoke/", views.invitation_revoke, name="invitation_revoke"),
    path("workspaces/<slug:slug>/settings/", views.workspace_settings, name="settings"),
    path("workspaces/<slug:slug>/delete/", views.workspace_delete, name="workspace_delete"),
    path("workspaces/<slug:slug>/audit/", views.audit, name="audit"),
    path("workspaces/<slug:slug>/analytics/", analytics.analytics, name="analytics"),
    path("workspaces/<slug:slug>/analytics.csv", analytics.analytics_csv, name="analytics_csv"),
    path("workspaces/<slug:slug>/analytics/answers/<int:pk>/", analytics.analytics_answer, name="analytics_answer"),
    path("workspaces/<slug:slug>/evaluation/", evaluation.evaluation_runs, name="evaluation"),
    path("workspaces/<slug:slug>/evaluation/<int:pk>/", evaluation.evaluation_run, name="evaluation_run"),
]

# Installation-wide, not a workspace's: the models every workspace answers with (staff change them).
urlpatterns += [
    path("models/", model_settings.models_page, name="models"),
    path("models/endpoints/", model_settings.endpoint_add, name="model_endpoint_add"),
    path("models/endpoints/ollama/", model_settings.ollama_connect, name="model_ollama_connect"),
    path("models/endpoints/<int:pk>/check/", model_settings.endpoint_check, name="model_endpoint_check"),
    path("models/endpoints/<int:pk>/key/", model_settings.endpoint_key, name="model_endpoint_key"),
    path("models/endpoints/<int:pk>/delete/", model_settings.endpoint_delete, name="model_endpoint_delete"),
    path("models/chat/", model_settings.chat_pick, name="model_chat_pick"),
    path("models/embedding/", model_settings.embedding_pick, name="model_embedding_pick"),
    path("models/reembedding/", model_settings.reembedding_progress, name="model_reembedding"),
    path("models/reembedding/<int:pk>/retry/", model_settings.reembedding_retry, name="model_reembedding_retry"),
]
