import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Django must be set up before anything imports models (consumers, routing).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from config.routing import websocket_urlpatterns  # noqa: E402
from knowledge.api.mcp import MCP_PATH, mcp_app  # noqa: E402
from knowledge.web.upload_gate import refuse_oversized_uploads  # noqa: E402

django_app = refuse_oversized_uploads(django_asgi_app)


async def http_app(scope, receive, send):
    """The MCP server (an ASGI app of the `mcp` package) at /mcp; Django everywhere else, behind
    the refusal of oversized uploads, which must come before Django reads the body."""
    app = mcp_app if scope["path"].rstrip("/") == MCP_PATH else django_app
    await app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
