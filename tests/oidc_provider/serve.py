"""Start the test OpenID Provider: migrate its SQLite database, make its people and our client,
then serve HTTP on the given port until killed.

    python -m tests.oidc_provider.serve PORT CLIENT_ID CLIENT_SECRET REDIRECT_URI [REDIRECT_URI ...]

People: alice (verified email, in the group "acme-editors"), mallory (an unverified email); both
with the password "op-password".
"""

import os
import sys

import django


def main() -> None:
    port, client_id, client_secret, *redirect_uris = sys.argv[1:]
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"
    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0, interactive=False)
    editors, _ = Group.objects.get_or_create(name="acme-editors")
    alice = User.objects.create_user(
        "alice", "alice@corp.example", "op-password", first_name="Alice", last_name="Liddell"
    )
    alice.groups.add(editors)
    User.objects.create_user("mallory", "mallory@corp.example", "op-password", first_name="Mal", last_name="Unverified")
    Application.objects.create(
        name="GraphRAG Teams",
        client_id=client_id,
        client_secret=client_secret,
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=" ".join(redirect_uris),
        post_logout_redirect_uris=" ".join(uri.replace("/login/sso/callback/", "/login/") for uri in redirect_uris),
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=False,
    )
    call_command("runserver", f"127.0.0.1:{port}", use_reloader=False, use_threading=True, skip_checks=True)


if __name__ == "__main__":
    main()
