from django.urls import path

from chat import views

app_name = "chat"

urlpatterns = [
    path("", views.chat_page, name="new"),
    path("c/<int:conversation_id>/", views.chat_page, name="conversation"),
    path("conversations/", views.conversation_list, name="conversations"),
    path("c/<int:conversation_id>/rename/", views.conversation_rename, name="rename"),
    path("c/<int:conversation_id>/share/", views.conversation_share, name="share"),
    path("c/<int:conversation_id>/delete/", views.conversation_delete, name="delete"),
    path("preferences/", views.preferences_save, name="preferences"),
    path("answers/<int:message_id>/sources/", views.answer_sources, name="sources"),
    path("answers/<int:message_id>/feedback/", views.answer_feedback, name="feedback"),
    path("graph/neighbours/", views.graph_neighbours, name="neighbours"),
]
