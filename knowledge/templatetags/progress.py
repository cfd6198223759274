from django import template

register = template.Library()


@register.filter
def time_left(seconds) -> str:
    """Seconds as a reader estimates them: "under a minute", "about 4 min", "about 2 h 10 min"."""
    try:
        seconds = int(seconds)
    except (TypeError, ValueError):
        return ""
    if seconds < 60:
        return "under a minute"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"about {hours} h {minutes} min" if minutes else f"about {hours} h"
