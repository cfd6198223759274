from django.core.management.base import CommandError


def workspace_by_slug(slug: str):
    """The workspace a command names. Commands are run by operators, not members, so no role check."""
    from knowledge.models import Workspace

    workspace = Workspace.objects.filter(slug=slug).first()
    if workspace is None:
        raise CommandError(f"No workspace with slug {slug!r}.")
    return workspace
