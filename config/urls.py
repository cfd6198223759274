from django.contrib import admin
from django.urls import include, path

from knowledge.api import urls as api_urls
from knowledge.api.metrics import scrape
from knowledge.web import accounts, sso
from knowledge.web import urls as web_urls
from knowledge.web.views import healthz, home

urlpatterns = [
    path("login/", accounts.LoginView.as_view(), name="login"),
    path("logout/", sso.LogoutView.as_view(), name="logout"),
    path("login/sso/", sso.SignInView.as_view(), name="sso_login"),
    path("login/sso/callback/", sso.CallbackView.as_view(), name="sso_callback"),
    path("signup/", accounts.signup, name="signup"),
    path("signup/<str:token>/", accounts.signup_complete, name="signup_complete"),
    path("invitations/<str:token>/", accounts.invitation, name="invitation"),
    path("account/", accounts.account, name="account"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", scrape, name="metrics"),
    # `home` stays outside the namespace: settings (LOGIN_REDIRECT_URL) and base.html name it.
    path("", home, name="home"),
    path("workspaces/<slug:slug>/chat/", include("chat.urls")),
    # Pages and API share the `knowledge` namespace, so URL names did not change with the layers.
    path("", include((web_urls.urlpatterns + api_urls.urlpatterns, "knowledge"))),
]
