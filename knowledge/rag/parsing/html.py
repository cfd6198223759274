"""HTML to text with its headings: the main content by trafilatura, else every visible block.

trafilatura was chosen over readability-lxml by measurement on real documentation pages (see
docs/ingestion.md, "The pipeline"): it drops navigation, sidebars, "previous/next" blocks and footers as well
and keeps headings with their levels, lists, tables and code blocks, which readability flattens
or loses.
"""

import re
from functools import cache

import lxml.etree
import lxml.html

from knowledge.rag.parsing.structure import Builder

# Below this much visible text a page has no boilerplate worth separating, and trafilatura's
# scoring (built for pages with navigation around an article) merges or drops the few blocks.
MAIN_CONTENT_MIN_CHARS = 250
# A title block longer than this is content of its own, which trafilatura judged already.
TITLE_BLOCK_MAX_CHARS = 600

_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_SKIPPED = {
    "script", "style", "noscript", "template", "head", "svg", "iframe", "object", "embed", "canvas",
    "nav", "aside", "header", "footer", "form", "button", "select", "input", "textarea", "title", "meta", "link",
}  # fmt: skip
_PARAGRAPHS = {"p", "blockquote", "figcaption", "caption", "address", "summary", "dt", "dd", "li"}
_CONTAINERS = {
    "html", "body", "div", "section", "article", "main", "ul", "ol", "dl", "figure", "details", "center",
    "tbody", "thead", "tfoot", "fieldset", "hgroup",
}  # fmt: skip
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>", re.IGNORECASE)
# Sphinx and others put a pilcrow or an anchor sign after every heading ("Key Functions¶").
_HEADING_MARKS = " ¶#§🔗"


@cache
def _trafilatura_config():
    from trafilatura.settings import use_config

    config = use_config()
    # No SIGALRM-based timeout: parsing may run on a worker's thread, where signals cannot be set.
    config.set("DEFAULT", "EXTRACTION_TIMEOUT", "0")
    # The upload limit already bounds the size; trafilatura's own 20 MB cap would return nothing.
    config.set("DEFAULT", "MAX_FILE_SIZE", str(2**31))
    return config


def html_document(html: str, builder: Builder) -> None:
    """Add the page's main content (or, for a page too small to have boilerplate, all of it) to `builder`."""
    html = _XML_DECLARATION.sub("", html, count=1)
    if not html.strip():
        return
    try:
        root = lxml.html.fromstring(html)
    except (lxml.etree.ParserError, ValueError):
        return
    if len(" ".join(root.text_content().split())) >= MAIN_CONTENT_MIN_CHARS:
        main = _main_content(html)
        if main is not None:
            _title_block(root, _text(main), builder)
            _trafilatura_blocks(main, builder)
            return
    html_blocks(root, builder)


def _title_block(root, main_text: str, builder: Builder) -> None:
    """The page's first h1 and the short block around it, when the main content left them out.

    Documentation pages put their title and one-line summary above the content ("git-bisect -
    Use binary search to find the commit that introduced a bug", in the header block of every
    asciidoc manual page), where trafilatura takes them for a site header. It is often the page's
    most informative line, and the one a question about the page names.
    """
    heading = next(root.iter("h1"), None)
    title = _text(heading) if heading is not None else ""
    if not title or title in main_text or any(ancestor.tag in _SKIPPED for ancestor in heading.iterancestors()):
        return
    block = heading.getparent()
    if block is not None and block.tag not in {"body", "html"} and len(_text(block)) <= TITLE_BLOCK_MAX_CHARS:
        html_blocks(block, builder)
    else:
        builder.heading(1, title.rstrip(_HEADING_MARKS))


def _main_content(html: str):
    import trafilatura

    xml = trafilatura.extract(
        html,
        output_format="xml",
        include_formatting=True,
        include_tables=True,
        include_links=False,
        include_images=False,
        include_comments=False,
        favor_recall=True,
        config=_trafilatura_config(),
    )
    if not xml:
        return None
    main = lxml.etree.fromstring(xml.encode(), lxml.etree.XMLParser(resolve_entities=False, no_network=True)).find(
        "main"
    )
    return main if main is not None and len(main) else None


def _text(element) -> str:
    return " ".join("".join(element.itertext()).split())


def _trafilatura_blocks(main, builder: Builder) -> None:
    for element in main:
        tag = element.tag
        if tag == "head":
            level = int((element.get("rend") or "h2").lstrip("h") or 2)
            builder.heading(min(max(level, 1), 6), _text(element).rstrip(_HEADING_MARKS))
        elif tag == "code":
            builder.block("".join(element.itertext()))
        elif tag == "list":
            _trafilatura_list(element, builder)
        elif tag == "table":
            _table([[_text(cell) for cell in row.iter("cell")] for row in element.iter("row")], builder)
        else:
            builder.block(_text(element), keep_lines=False)


def _trafilatura_list(element, builder: Builder) -> None:
    lines = []
    for item in element.findall("item"):
        rend = item.get("rend") or ""
        text = _text(item)
        if text:
            lines.append(text if rend.startswith("dt") else f"- {text}")
    builder.block("\n".join(lines))


def _table(rows: list[list[str]], builder: Builder) -> None:
    rows = [row for row in rows if any(row)]
    if not rows:
        return
    builder.block("\n".join(" | ".join(row) for row in rows))


def html_blocks(element, builder: Builder) -> None:
    """Every visible block under `element`, headings as headings; navigation, headers, footers,
    asides and forms (HTML5's own boilerplate elements) left out."""
    pending = [element.text or ""]
    for child in element:
        tag = child.tag.lower() if isinstance(child.tag, str) else ""
        if not tag or tag in _SKIPPED or child.get("role") == "navigation" or child.get("hidden") is not None:
            pending.append(child.tail or "")
            continue
        if tag in _HEADINGS or tag in _PARAGRAPHS or tag in _CONTAINERS or tag in {"pre", "table", "br", "hr"}:
            builder.block("".join(pending), keep_lines=False)
            if tag in _HEADINGS:
                builder.heading(_HEADINGS[tag], child.text_content().rstrip(_HEADING_MARKS))
            elif tag == "pre":
                builder.block(child.text_content())
            elif tag == "table":
                _table([[_text(cell) for cell in row.iter("td", "th")] for row in child.iter("tr")], builder)
            elif tag == "li":
                builder.block(f"- {_text(child)}", keep_lines=False)
            elif tag in _PARAGRAPHS:
                builder.block(_text(child), keep_lines=False)
            elif tag in _CONTAINERS:
                html_blocks(child, builder)
            pending = [child.tail or ""]
        else:
            pending += [child.text_content(), child.tail or ""]
    builder.block("".join(pending), keep_lines=False)
