from django.urls import path

from knowledge.evaluation import views

urlpatterns = [
    path("workspaces/<slug:slug>/evaluation/", views.evaluation_runs, name="evaluation"),
    path("workspaces/<slug:slug>/evaluation/<int:pk>/", views.evaluation_run, name="evaluation_run"),
]
