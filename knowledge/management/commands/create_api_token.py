from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from knowledge.models import ApiToken
from knowledge.services.api_tokens import SCOPE_ASK, api_token_create


class Command(BaseCommand):
    help = "Create an API token for a user and print it. The token is shown only this once."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="username of the token's owner")
        parser.add_argument("--name", required=True, help="a label to recognise the token by, e.g. 'ci-bot'")
        parser.add_argument(
            "--scope",
            choices=ApiToken.Scope.values,
            default=SCOPE_ASK,
            help="read: list and read; ask: also ask (the default); write: also upload and delete documents",
        )
        parser.add_argument(
            "--expires-days", type=int, default=None, help="days until the token stops working (default: never)"
        )

    def handle(self, *args, user, name, scope, expires_days, **options):
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"No user named {user!r}.")
        if not name.strip():
            raise CommandError("--name must not be empty.")
        if expires_days is not None and expires_days < 1:
            raise CommandError("--expires-days must be at least 1.")
        expires_in = timedelta(days=expires_days) if expires_days is not None else None
        token, secret = api_token_create(user=owner, name=name.strip()[:100], scope=scope, expires_in=expires_in)
        until = f", expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else ""
        self.stderr.write(
            f"API token {name.strip()!r} for {owner.username} (scope {scope}{until}); "
            "store it now, it is not shown again:"
        )
        self.stdout.write(secret)
