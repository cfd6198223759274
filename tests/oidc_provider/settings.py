"""A real OpenID Provider for the single sign-on tests: django-oauth-toolkit in OIDC mode, in a
process of its own (tests/oidc_provider/serve.py starts it), with its own SQLite database.

Not part of the product: the tests sign in through it as people sign in through Keycloak, Okta,
Entra ID or Google Workspace.
"""

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECRET_KEY = os.environ["OP_SECRET_KEY"]
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.oidc_provider.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["OP_DATABASE"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [HERE / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
            ]
        },
    }
]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGIN_URL = "/login/"
# Cookies are per host, not per port: on 127.0.0.1 beside the app under test, the provider's
# own names keep the two sessions apart (a real provider lives on another host).
SESSION_COOKIE_NAME = "op_sessionid"
CSRF_COOKIE_NAME = "op_csrftoken"
USE_TZ = True
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": os.environ["OP_RSA_KEY"],
    "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
    "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,
    "PKCE_REQUIRED": True,
    "SCOPES": {"openid": "Who you are", "email": "Your email address", "profile": "Your name", "groups": "Your groups"},
    "OAUTH2_VALIDATOR_CLASS": "tests.oidc_provider.validator.Validator",
}
