from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from knowledge.models import Membership, Role, Workspace


class Command(BaseCommand):
    help = "Create the demo user (a superuser) and the demo workspace it owns, when missing."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default="demo")

    @transaction.atomic
    def handle(self, *args, username, password, **options):
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
        workspace, _ = Workspace.objects.get_or_create(
            slug="demo",
            defaults={"name": "Demo", "description": "A workspace to try things out."},
        )
        Membership.objects.get_or_create(user=user, workspace=workspace, defaults={"role": Role.OWNER})
        state = "created" if created else "exists (password unchanged)"
        self.stdout.write(f"Demo user {username!r} {state}; workspace 'demo' ready.")
