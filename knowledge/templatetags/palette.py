from django import template

from knowledge.web.palette import type_slot

register = template.Library()


@register.filter
def type_class(type_name: str | None) -> str:
    """The CSS class that colours an entity type (`type-<slot>`, see knowledge/web/palette.py)."""
    return f"type-{type_slot(type_name)}"
