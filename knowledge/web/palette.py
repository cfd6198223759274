"""One colour per entity type on every page: the chat's subgraph, the graph view and the entity pages.

The colours live in static/css/app.css as `--type-<slot>`; this module and static/js/palette.js
map a type to its slot by the same rule (a browser test checks that they agree). The default
types get fixed slots on the Okabe-Ito palette, which stays distinguishable with the common forms
of colour blindness; any other type gets one of four spare slots from Paul Tol's palette by a hash
of its name, so it keeps its colour from page to page.
"""

TYPE_SLOTS = {
    "person": 0,
    "organization": 1,
    "location": 2,
    "event": 3,
    "product": 4,
    "technology": 5,
    "concept": 6,
    "date": 7,
}
SPARE_SLOTS = (8, 9, 10, 11)
OTHER_SLOT = 12
UNTYPED = {"", "other", "unknown"}


def type_slot(type_name: str | None) -> int:
    key = (type_name or "").strip().lower()
    if key in UNTYPED:
        return OTHER_SLOT
    if key in TYPE_SLOTS:
        return TYPE_SLOTS[key]
    code = 0
    for char in key:
        code = (code * 31 + ord(char)) % 2**32
    return SPARE_SLOTS[code % len(SPARE_SLOTS)]
