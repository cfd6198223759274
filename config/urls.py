from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from knowledge.views import healthz

urlpatterns = [
    path(
        "login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("workspaces/<slug:slug>/chat/", include("chat.urls")),
    path("", include("knowledge.urls")),
]
