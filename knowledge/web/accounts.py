"""People's own pages: logging in (password or single sign-on), following an invitation, signing
up, and their account (name and password). Each view parses, calls one service, renders."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login, update_session_auth_hash
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import PasswordChangeForm, SetPasswordForm
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from knowledge.services import accounts, invitations
from knowledge.services.ratelimits import RateLimited
from knowledge.web.forms import EmailForm, NameForm, NewAccountForm

PASSWORD_BACKEND = "knowledge.web.accounts.UsernameOrEmailBackend"  # noqa: S105 - a class path


class UsernameOrEmailBackend(ModelBackend):
    """Passwords, with the username or the email an invitation went to. With PASSWORD_LOGIN off,
    only superusers sign in with a password (at /admin/login/, for when the provider is down)."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username and "@" in username:
            try:
                user = accounts.user_with_email(username)
            except accounts.AccountError:
                user = None
            username = user.get_username() if user is not None else username
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None and not settings.PASSWORD_LOGIN and not user.is_superuser:
            return None
        return user


def sign_in_options() -> dict:
    return {
        "sso_enabled": settings.SSO_ENABLED,
        "sso_name": settings.OIDC_PROVIDER_NAME,
        "password_login": settings.PASSWORD_LOGIN,
        "signup_enabled": settings.SIGNUP_ENABLED,
    }


class LoginView(auth_views.LoginView):
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), **sign_in_options()}


def _base_url(request) -> str:
    return request.build_absolute_uri("/")


def _new_account(form) -> accounts.NewAccount:
    data = form.cleaned_data
    return accounts.NewAccount(
        username=data["username"],
        first_name=data["first_name"],
        last_name=data["last_name"],
        password=data["password1"],
    )


@require_http_methods(["GET", "POST"])
def invitation(request, token):
    """An invitation link: accept it signed in (with the invited address), or make the account
    it invites (a password, or single sign-on coming back here)."""
    try:
        invite = invitations.invitation_from_token(token)
    except invitations.InvitationError as err:
        used = getattr(err, "invitation", None)
        if used is not None and used.accepted_by_id is not None and used.accepted_by_id == request.user.pk:
            return redirect("knowledge:workspace", slug=used.workspace.slug)
        return render(request, "registration/invitation.html", {"error": str(err)}, status=410)
    form = NewAccountForm(initial={"username": accounts.username_suggestion(invite.email)})
    problem = ""
    if request.method == "POST":
        try:
            if request.user.is_authenticated:
                invitations.invitation_accept(token=token, user=request.user)
            else:
                form = NewAccountForm(request.POST)
                if form.is_valid():
                    user = invitations.invitation_accept_new_account(token=token, account=_new_account(form))
                    login(request, user, backend=PASSWORD_BACKEND)
            if request.user.is_authenticated:
                messages.success(request, f"Welcome to {invite.workspace.name}: you joined as {invite.role}.")
                return redirect("knowledge:workspace", slug=invite.workspace.slug)
        except accounts.AccountError as err:
            if form.is_bound:
                form.add_error(None, str(err))
            else:
                problem = str(err)
    context = {
        "invitation": invite,
        "form": form,
        "problem": problem,
        "existing_account": not request.user.is_authenticated and _has_account(invite.email),
        "here": request.get_full_path(),
        **sign_in_options(),
    }
    return render(request, "registration/invitation.html", context, status=400 if form.errors or problem else 200)


def _has_account(email: str) -> bool:
    try:
        return accounts.user_with_email(email) is not None
    except accounts.AccountError:
        # Several accounts share the address: logging in is the way, whichever of them it is.
        return True


@require_http_methods(["GET", "POST"])
def signup(request):
    if not settings.SIGNUP_ENABLED:
        raise Http404("Sign-up is closed.")
    form = EmailForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            email = accounts.signup_start(
                email=form.cleaned_data["email"], base_url=_base_url(request), address=request.META.get("REMOTE_ADDR")
            )
        except accounts.AccountError as err:
            form.add_error("email", str(err))
        except RateLimited as limited:
            form.add_error("email", str(limited))
        else:
            return render(request, "registration/signup_sent.html", {"email": email})
    context = {"form": form, "domains": settings.SIGNUP_EMAIL_DOMAINS, **sign_in_options()}
    return render(request, "registration/signup.html", context, status=400 if form.errors else 200)


@require_http_methods(["GET", "POST"])
def signup_complete(request, token):
    try:
        email = accounts.signup_email_from_token(token)
    except accounts.AccountError as err:
        return render(request, "registration/signup_complete.html", {"error": str(err)}, status=410)
    form = NewAccountForm(
        request.POST if request.method == "POST" else None, initial={"username": accounts.username_suggestion(email)}
    )
    if request.method == "POST" and form.is_valid():
        try:
            user = accounts.signup_complete(token=token, account=_new_account(form))
        except accounts.AccountError as err:
            form.add_error(None, str(err))
        else:
            login(request, user, backend=PASSWORD_BACKEND)
            messages.success(request, "Your account is ready. Create a workspace, or ask to be invited to one.")
            return redirect("home")
    context = {"email": email, "form": form}
    return render(request, "registration/signup_complete.html", context, status=400 if form.errors else 200)


@login_required
@require_http_methods(["GET", "POST"])
def account(request):
    """The user's name and password (a user made by single sign-on may set a password too, for
    when the provider is down, unless password login is off)."""
    user = request.user
    password_form_class = PasswordChangeForm if user.has_usable_password() else SetPasswordForm
    name_form = NameForm(initial={"first_name": user.first_name, "last_name": user.last_name})
    password_form = password_form_class(user)
    if request.method == "POST" and request.POST.get("form") == "name":
        name_form = NameForm(request.POST)
        if name_form.is_valid():
            accounts.account_update_name(user=user, **name_form.cleaned_data)
            messages.success(request, "Your name is saved.")
            return redirect("account")
    elif request.method == "POST" and request.POST.get("form") == "password" and settings.PASSWORD_LOGIN:
        password_form = password_form_class(user, request.POST)
        if password_form.is_valid():
            password_form.save()
            # Keeps this session signed in; every other session of the user ends.
            update_session_auth_hash(request, password_form.user)
            messages.success(request, "Your password is changed; your other sessions were logged out.")
            return redirect("account")
    context = {
        "name_form": name_form,
        "password_form": password_form,
        "has_password": user.has_usable_password(),
        "password_login": settings.PASSWORD_LOGIN,
        "signed_in_with_sso": bool(request.session.get("oidc_id_token")),
        "sso_name": settings.OIDC_PROVIDER_NAME,
        "memberships": user.memberships.select_related("workspace").order_by("workspace__name"),
    }
    status = 400 if name_form.errors or password_form.errors else 200
    return render(request, "registration/account.html", context, status=status)
