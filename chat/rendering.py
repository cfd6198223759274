"""Answers as HTML: markdown rendered on the server, then sanitized.

Model output is untrusted (a document can carry a prompt injection), so raw HTML is never
passed through and the result is cleaned with an allow-list. This is the only Markdown renderer:
the page shows a streaming answer as plain text until this rendering replaces it (decision 0091).
The partials the chat socket sends the page are rendered here too.
"""

import re

import nh3
from django.template.loader import render_to_string
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token

from chat.models import Message
from knowledge.rag.answer import answer_is_extractive
from knowledge.rag.answer.citations import CITATION_ID_RE, CITATION_RE, citation_href, cited_ids

ALLOWED_TAGS = {
    "p", "br", "hr", "strong", "em", "s", "del", "code", "pre", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
    "a", "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {"a": {"href", "title", "class", "data-cite"}, "ol": {"start"}}
ALLOWED_URL_SCHEMES = {"http", "https", "mailto"}
_SAFE_LINK_RE = re.compile(r"^(?:https?:|mailto:|#)", re.IGNORECASE)


def _validate_link(url: str) -> bool:
    return bool(_SAFE_LINK_RE.match(url.strip()))


def _images_as_text(state: StateCore) -> None:
    """Remote images would leak every reader's address to whoever the model (or a poisoned
    document) names, so answers carry no images: an image is its alt text, with no address."""
    for block in state.tokens:
        if block.type == "inline" and block.children:
            block.children = [_text(token.content) if token.type == "image" else token for token in block.children]


def _citation_links(state: StateCore) -> None:
    """Turn citation markers in plain text into links to their row in the citations table; with
    `citation_ids` in the environment, markers of rows the context did not hold are dropped."""
    known = state.env.get("citation_ids")
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        children: list[Token] = []
        inside_link = 0
        for token in block.children:
            inside_link += token.type == "link_open"
            inside_link -= token.type == "link_close"
            if token.type != "text" or inside_link or not CITATION_RE.search(token.content):
                children.append(token)
                continue
            children.extend(_split_citations(token.content, known))
        block.children = children


def _split_citations(text: str, known: set[str] | None) -> list[Token]:
    tokens: list[Token] = []
    position = 0
    for match in CITATION_RE.finditer(text):
        if match.start() > position:
            tokens.append(_text(text[position : match.start()]))
        # A marker the context never held is invented (a document can ask for one): it goes.
        ids = [found for found in CITATION_ID_RE.findall(match.group(1)) if known is None or found in known]
        for index, citation_id in enumerate(ids):
            if index:
                tokens.append(_text(" "))
            link = Token("link_open", "a", 1)
            link.attrs = {"href": f"#cite-{citation_id}", "class": "cite", "data-cite": citation_id}
            tokens.extend([link, _text(f"[{citation_id}]"), Token("link_close", "a", -1)])
        position = match.end()
    if position < len(text):
        tokens.append(_text(text[position:]))
    return tokens


def _text(content: str) -> Token:
    token = Token("text", "", 0)
    token.content = content
    return token


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.validateLink = _validate_link
    md.core.ruler.push("images_as_text", _images_as_text)
    md.core.ruler.push("citation_links", _citation_links)
    return md


_MD = _markdown()


def render_answer(text: str, *, citations: list[dict] | None = None) -> str:
    """Sanitized HTML of a markdown answer, citation markers linked to their rows. Given the
    answer's `citations` (the context's rows), markers of any other id are dropped."""
    env = {} if citations is None else {"citation_ids": {str(citation.get("id")) for citation in citations}}
    html = _MD.render(text, env)
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        clean_content_tags={"script", "style"},
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=ALLOWED_URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
    )


def _linked(citation: dict, *, workspace_slug: str) -> dict:
    """A citation with its link and where it is (section, page) when the citation says so."""
    where = " · ".join(part for part in (citation.get("section"), citation.get("location")) if part)
    return {**citation, "href": citation_href(citation, workspace_slug=workspace_slug), "where": where}


_KIND_ORDER = {"source": 0, "entity": 1, "relation": 2}


def _by_kind(citation: dict) -> int:
    return _KIND_ORDER.get(citation.get("kind"), len(_KIND_ORDER))


def cited_citations(message, *, workspace_slug: str) -> list[dict]:
    """The citations an answer cites, in the order it cites them, sources first."""
    by_id = {str(citation.get("id")): citation for citation in message.citations or []}
    rows = [
        _linked(by_id[row_id], workspace_slug=workspace_slug)
        for row_id in cited_ids(message.content)
        if row_id in by_id
    ]
    return sorted(rows, key=_by_kind)


def sources_context(*, message, workspace) -> dict:
    """What chat/_sources.html needs to show an answer's sources (`message`, saved or still
    streaming, with its citations, subgraph and keywords): the rows it cites, everything else
    it was given, its keywords, and the data the graph panel draws (static/js/chat.js)."""
    cited = cited_citations(message, workspace_slug=workspace.slug)
    cited_set = {citation["id"] for citation in cited}
    rest = [
        _linked(citation, workspace_slug=workspace.slug)
        for citation in sorted(message.citations or [], key=_by_kind)
        if citation.get("id") not in cited_set
    ]
    keywords = message.keywords or {}
    names = keywords.get("low_level", [])
    named = {name.casefold() for name in names}
    return {
        "sources_message": message,
        "cited_rows": cited,
        "retrieved_rows": rest,
        # LightRAG's two levels, each term once: a theme that is also a name is shown as a name.
        "keyword_names": names,
        "keyword_themes": [term for term in keywords.get("high_level", []) if term.casefold() not in named],
        "graph_data": {
            "answer": message.pk,
            "subgraph": message.subgraph or {},
            "citations": message.citations or [],
            "cited": [citation["id"] for citation in cited],
        },
    }


def render_sources(*, message, workspace) -> str:
    """The sources panel of an answer, swapped in over the chat socket."""
    return render_to_string(
        "chat/_sources.html", {"workspace": workspace, **sources_context(message=message, workspace=workspace)}
    )


def prepare_message(message, *, workspace, html: str | None = None):
    """What chat/_message.html needs of an answer: its HTML (given when the turn already rendered
    it) and the sources it cites."""
    if message.role == "assistant":
        message.html = render_answer(message.content, citations=message.citations or []) if html is None else html
        message.cited_sources = cited_citations(message, workspace_slug=workspace.slug)
    return message


def render_message(message, *, workspace, html: str | None = None) -> str:
    """A streamed answer as a reloaded conversation draws it, to replace the open one on the page."""
    message = prepare_message(message, workspace=workspace, html=html)
    context = {"message": message, "workspace": workspace, "extractive": answer_is_extractive(), "streamed": True}
    return render_to_string("chat/_message.html", context)


def render_turn(*, workspace, conversation, question: str, mode: str, user, new_conversation: bool) -> str:
    """A question just asked and its open answer, for the page (chat/_turn.html)."""
    extractive = answer_is_extractive()
    context = {
        "workspace": workspace,
        "conversation": conversation,
        "user": user,
        "new_conversation": new_conversation,
        "extractive": extractive,
        "question": Message(role=Message.Role.USER, content=question),
        "answer": Message(role=Message.Role.ASSISTANT, mode=mode, extractive=extractive),
    }
    return render_to_string("chat/_turn.html", context)
