"""Single sign-on with OpenID Connect: mozilla-django-oidc's authorization-code flow (state, nonce,
PKCE, the ID token's signature against the provider's keys), configured from the provider's
discovery document instead of one setting per endpoint, with the checks it leaves to us:

- the ID token's issuer must be the discovery document's, and its audience our client;
- a state is used once (the library forgets it) and only for OIDC_STATE_SECONDS;
- every refusal is a page that says what happened and what to do, never a bare 400 or a loop
  back to the login page.

Who the person is here (verified email, new accounts, group roles) is knowledge.services.sso's.
"""

import logging
import time
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib import messages
from django.core.cache import cache
from django.core.exceptions import SuspiciousOperation
from django.shortcuts import redirect, render, resolve_url
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView, OIDCLogoutView

from knowledge.services import links
from knowledge.services.sso import SignInRefused, sso_user_for_claims

logger = logging.getLogger(__name__)

DISCOVERY_CACHE_SECONDS = 3600


class ProviderUnreachable(Exception):
    """The identity provider's discovery document, keys or token endpoint could not be read."""


def discovery() -> dict:
    """The provider's discovery document (issuer, endpoints, keys), cached for an hour."""
    key = f"oidc:discovery:{settings.OIDC_DISCOVERY_URL}"
    config = cache.get(key)
    if config is None:
        try:
            response = requests.get(
                settings.OIDC_DISCOVERY_URL, timeout=settings.OIDC_TIMEOUT, verify=settings.OIDC_VERIFY_SSL
            )
            response.raise_for_status()
            config = response.json()
        except (requests.RequestException, ValueError) as exc:
            logger.warning("OIDC discovery at %s failed: %s", settings.OIDC_DISCOVERY_URL, exc)
            raise ProviderUnreachable(str(exc)) from exc
        needed = ("issuer", "authorization_endpoint", "token_endpoint", "jwks_uri")
        if not isinstance(config, dict) or any(not config.get(name) for name in needed):
            raise ProviderUnreachable(f"the discovery document lacks one of {', '.join(needed)}")
        cache.set(key, config, DISCOVERY_CACHE_SECONDS)
    return config


class ProviderBackend(OIDCAuthenticationBackend):
    """The library's backend with endpoints from discovery, read only when a callback arrives (the
    backend is also built for every password login, which must not wait on the provider)."""

    def __init__(self, *args, **kwargs):
        from django.contrib.auth import get_user_model

        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request, **kwargs):
        if request is None or "nonce" not in kwargs:
            return None
        config = discovery()
        self.issuer = config["issuer"]
        self.OIDC_OP_TOKEN_ENDPOINT = config["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = config.get("userinfo_endpoint", "")
        self.OIDC_OP_JWKS_ENDPOINT = config["jwks_uri"]
        return super().authenticate(request, **kwargs)

    def verify_token(self, token, **kwargs):
        payload = super().verify_token(token, **kwargs)
        if payload.get("iss") != self.issuer:
            raise SignInRefused(
                f"The sign-in came back from {payload.get('iss')!r}, not from the identity provider this site "
                f"trusts ({self.issuer}). Nobody was signed in; an administrator should check OIDC_DISCOVERY_URL."
            )
        audience = payload.get("aud")
        if self.OIDC_RP_CLIENT_ID not in (audience if isinstance(audience, list) else [audience]):
            raise SignInRefused(
                "The identity provider's answer was meant for another application; nobody was signed in."
            )
        self.id_claims = payload
        return payload

    def get_userinfo(self, access_token, id_token, payload):
        return super().get_userinfo(access_token, id_token, payload) if self.OIDC_OP_USER_ENDPOINT else {}

    def get_or_create_user(self, access_token, id_token, payload):
        # The ID token vouches for the person; the userinfo endpoint may add claims (groups, names).
        claims = {**payload, **self.get_userinfo(access_token, id_token, payload)}
        if claims.get("sub") != payload.get("sub"):
            raise SignInRefused("The identity provider described two different people; nobody was signed in.")
        return sso_user_for_claims(claims)


def _not_configured(request):
    messages.error(request, "Single sign-on is not configured here; log in with your password.")
    return redirect("login")


def _refused(request, message: str, *, status: int = 403):
    return render(request, "registration/sso_refused.html", {"message": message}, status=status)


class SignInView(OIDCAuthenticationRequestView):
    """Off to the provider: state, nonce and PKCE by the library, endpoints from discovery."""

    def __init__(self, *args, **kwargs):
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request):
        if not settings.SSO_ENABLED:
            return _not_configured(request)
        try:
            self.OIDC_OP_AUTH_ENDPOINT = discovery()["authorization_endpoint"]
        except ProviderUnreachable:
            return _refused(request, _UNREACHABLE, status=502)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        return super().get(request)


_UNREACHABLE = (
    "The identity provider could not be reached, so nobody can sign in with it just now. Try again in a "
    "minute; if it persists, an administrator should check OIDC_DISCOVERY_URL and the provider."
)


class CallbackView(OIDCAuthenticationCallbackView):
    """Back from the provider. The library trades the code for tokens and checks them; every way
    that can fail ends on a page that says which."""

    def get(self, request):
        if not settings.SSO_ENABLED:
            return _not_configured(request)
        if request.GET.get("error"):
            reason = request.GET.get("error_description") or request.GET["error"]
            super().get(request)
            return _refused(request, f"The identity provider did not sign you in ({reason}).")
        states = request.session.get("oidc_states") or {}
        state = states.get(request.GET.get("state", ""))
        if not request.GET.get("code") or state is None:
            return _refused(
                request,
                "This sign-in was already completed, or it was started in another browser. "
                "Nothing was signed in twice; start again from the login page.",
            )
        if time.time() - state.get("added_on", 0) > settings.OIDC_STATE_SECONDS:
            del states[request.GET["state"]]
            request.session["oidc_states"] = states
            return _refused(
                request,
                f"This sign-in took longer than {settings.OIDC_STATE_SECONDS // 60} minutes, so it expired. "
                "Start again from the login page.",
            )
        try:
            return super().get(request)
        except SignInRefused as refusal:
            return _refused(request, str(refusal))
        except ProviderUnreachable:
            return _refused(request, _UNREACHABLE, status=502)
        except (SuspiciousOperation, jwt.InvalidTokenError) as exc:
            logger.warning("An OIDC sign-in failed its checks: %s", exc)
            return _refused(request, f"The identity provider's answer failed our checks ({exc}); nobody was signed in.")
        except requests.RequestException as exc:
            logger.warning("An OIDC sign-in could not reach the provider: %s", exc)
            return _refused(request, _UNREACHABLE, status=502)

    def login_failure(self):
        return _refused(self.request, "The identity provider did not sign you in; start again from the login page.")


def provider_logout_url(request) -> str:
    """Where logging out goes: the login page, or, with OIDC_LOGOUT_FROM_PROVIDER and a session
    that came from the provider, the provider's own logout, which sends the person back here."""
    back = links.absolute(request.build_absolute_uri("/"), resolve_url(settings.LOGOUT_REDIRECT_URL))
    id_token = request.session.get("oidc_id_token")
    if not (settings.SSO_ENABLED and settings.OIDC_LOGOUT_FROM_PROVIDER and id_token):
        return resolve_url(settings.LOGOUT_REDIRECT_URL)
    try:
        end_session = discovery().get("end_session_endpoint")
    except ProviderUnreachable:
        end_session = None
    if not end_session:
        return resolve_url(settings.LOGOUT_REDIRECT_URL)
    query = {"id_token_hint": id_token, "post_logout_redirect_uri": back, "client_id": settings.OIDC_RP_CLIENT_ID}
    return f"{end_session}?{urlencode(query)}"


class LogoutView(OIDCLogoutView):
    """Log out (POST only), and out of the provider too when so configured."""
