from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from knowledge.api_tokens import api_token_create


class Command(BaseCommand):
    help = "Create an API token for a user and print it. The token is shown only this once."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="username of the token's owner")
        parser.add_argument("--name", required=True, help="a label to recognise the token by, e.g. 'ci-bot'")

    def handle(self, *args, user, name, **options):
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"No user named {user!r}.")
        if not name.strip():
            raise CommandError("--name must not be empty.")
        _, secret = api_token_create(user=owner, name=name.strip()[:100])
        self.stderr.write(f"API token {name.strip()!r} for {owner.username}; store it now, it is not shown again:")
        self.stdout.write(secret)
