from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from knowledge.api import urls as api_urls
from knowledge.web import urls as web_urls
from knowledge.web.views import healthz, home

urlpatterns = [
    path(
        "login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    # `home` stays outside the namespace: settings (LOGIN_REDIRECT_URL) and base.html name it.
    path("", home, name="home"),
    path("workspaces/<slug:slug>/chat/", include("chat.urls")),
    # Pages and API share the `knowledge` namespace, so URL names did not change with the layers.
    path("", include((web_urls.urlpatterns + api_urls.urlpatterns, "knowledge"))),
]
