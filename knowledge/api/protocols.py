"""What the OpenAI- and Ollama-compatible APIs share: model names, chat messages turned into one
ask request, LightRAG's query prefixes, and the sources list a chat client can show.

A "model" is a workspace asked in a mode: `acme` (the default mode), `acme:local`, ...; Ollama
clients add a tag to every name, so `acme:latest` is the default mode too. `acme/handbook` (and
`acme/handbook:local`) asks only the documents tagged "handbook": a client that can only pick a
model picks a scope that way (docs/clients.md, "Scopes"). The adapters
(knowledge/api/openai.py, knowledge/api/ollama.py) only map these onto their wire formats.
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from knowledge.models import Workspace
from knowledge.rag.answer.citations import citation_href, cited_ids
from knowledge.rag.retrieval import DEFAULT_MODE, MODES
from knowledge.services import links
from knowledge.services.asking import AskInvalid, AskRequest, ask_request

# Ollama's name for "no particular tag"; its clients send it when the user names none.
DEFAULT_TAG = "latest"

# LightRAG's query prefixes (lightrag/api/routers/ollama_api.py): "/local question" asks in local
# mode, "/context question" returns the retrieved context instead of an answer, "/localcontext"
# both; "/local[Bullet Points] question" also sets the answer's form (our response_type).
_PREFIX = re.compile(r"^/(?P<word>[a-z]*)(?:\[(?P<form>[^\]]*)\])?(?=\s|$)\s*", re.DOTALL)
_CONTEXT = "context"

# Open WebUI's background tasks (a chat's title, tags, follow-up suggestions) send a prompt that
# quotes the conversation; like LightRAG, we send them to the model without retrieval (bypass).
_CLIENT_TASK = re.compile(r"^\s*### Task:.*<chat_history>", re.DOTALL)

# Our answers end with their sources; a client sends earlier answers back as history, where the
# list would only cost tokens, so it is cut off there.
SOURCES_HEADING = "\n\n---\n**Sources**\n"

# The answer's options a client may pass next to its messages (our names, as in the HTTP API).
ASK_OPTIONS = ("top_k", "chunk_top_k", "response_type", "max_entity_tokens", "max_relation_tokens", "max_total_tokens")


class UnknownModel(Exception):
    """A model name that names no mode; answered like a workspace the caller may not see."""


@dataclass(frozen=True)
class Model:
    slug: str
    # None: the default mode, unless the question's prefix names one.
    mode: str | None
    # A document tag the question is scoped to; "": every document.
    tag: str = ""


def parse_model(name: object) -> Model:
    if not isinstance(name, str) or not name.strip():
        raise UnknownModel('\'model\' is required: a workspace, e.g. "acme" or "acme:local".')
    scoped, _, tag = name.strip().partition(":")
    slug, _, scope = scoped.partition("/")
    if tag in ("", DEFAULT_TAG):
        return Model(slug=slug, mode=None, tag=scope)
    if tag not in MODES:
        raise UnknownModel(f"The model {name!r} does not exist or you do not have access to it.")
    return Model(slug=slug, mode=tag, tag=scope)


def model_names(workspace: Workspace, *, default_tag: str = "", tags: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(name, mode) of every model a workspace offers: itself in the default mode, then one per
    mode, then one per document tag (scoped, in the default mode)."""
    suffix = f":{default_tag}" if default_tag else ""
    return [
        (f"{workspace.slug}{suffix}", DEFAULT_MODE),
        *((f"{workspace.slug}:{mode}", mode) for mode in MODES),
        *((f"{workspace.slug}/{tag}{suffix}", DEFAULT_MODE) for tag in tags),
    ]


def message_text(content: object) -> str:
    """A message's text: a string, or OpenAI's list of parts (its text parts joined)."""
    if isinstance(content, str):
        return content
    # Other parts (images, audio) are left out: retrieval and the answer read text only.
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, Mapping) and part.get("type") == "text"]
        if parts and all(isinstance(part, str) for part in parts):
            return "\n".join(parts)
    raise AskInvalid("A message's 'content' must be text (or a list of parts with text parts).")


def conversation(messages: object) -> tuple[str, list[dict]]:
    """The question (the last message, a user's) and the earlier user and assistant turns.

    System messages are left out: the answer's instructions are ours (they make it cite its
    sources); tool messages have nothing to say to retrieval.
    """
    if not isinstance(messages, list) or not messages or not all(isinstance(m, Mapping) for m in messages):
        raise AskInvalid('\'messages\' must be a non-empty list of {"role": ..., "content": ...} objects.')
    if messages[-1].get("role") != "user":
        raise AskInvalid('The last message must be the user\'s question (role "user").')
    history = [
        {"role": message["role"], "content": _without_sources(message_text(message.get("content")))}
        for message in messages[:-1]
        if message.get("role") in ("user", "assistant")
    ]
    return message_text(messages[-1].get("content")), history


def _without_sources(text: str) -> str:
    return text.split(SOURCES_HEADING, 1)[0]


def chat_request(
    *, model: Model, question: str, history: Sequence[dict] = (), options: Mapping | None = None
) -> AskRequest:
    """The ask request for a chat turn: the prefix, then the model, choose the mode."""
    options = dict(options or {})
    mode, context_only = model.mode, False
    found = _PREFIX.match(question)
    # "/[form] question" sets only the form; a bare "/" followed by a space is no prefix.
    word = found["word"] if found and (found["word"] or found["form"] is not None) else None
    if word is not None and word.removesuffix(_CONTEXT) in (*MODES, ""):
        context_only = word.endswith(_CONTEXT)
        mode = word.removesuffix(_CONTEXT) or model.mode
        if found["form"]:
            options["response_type"] = found["form"]
        question = question[found.end() :]
    elif _CLIENT_TASK.match(question):
        mode = "bypass"
    return ask_request(
        question=question,
        mode=mode,
        history=list(history),
        context_only=context_only,
        filters={"tags": [model.tag]} if model.tag else None,
        **{name: options.get(name) for name in ASK_OPTIONS},
    )


def cited_sources(*, answer: str | None, citations: Iterable[dict], base_url: str, workspace_slug: str) -> list[dict]:
    """The rows an answer cites, passages first, each with a link to the passage; when it cites
    none, the passages it was given. Links are absolute: PUBLIC_BASE_URL when set, else `base_url`,
    the host the request came to (http://host)."""
    citations = list(citations)
    by_id = {citation["id"]: citation for citation in citations}
    rows = [by_id[row_id] for row_id in cited_ids(answer or "") if row_id in by_id]
    if not rows:
        rows = [citation for citation in citations if citation["kind"] == "source"]
    rows.sort(key=lambda citation: citation["kind"] != "source")
    return [
        {
            "id": citation["id"],
            "kind": citation["kind"],
            "label": citation["label"],
            "document_id": citation["document_id"],
            "document_title": citation["document_title"],
            "chunk_id": citation["chunk_id"],
            "section": citation["section"],
            "location": citation["location"],
            "sentence": citation["sentence"],
            "excerpt": citation["excerpt"],
            "url": _absolute(base_url, citation_href(citation, workspace_slug=workspace_slug)),
        }
        for citation in rows
    ]


def _absolute(base_url: str, path: str) -> str:
    return links.absolute(base_url, path) if path else ""


def sources_text(sources: Sequence[dict]) -> str:
    """The sources as a Markdown list to append to an answer; empty when there are none."""
    if not sources:
        return ""
    lines = []
    for number, source in enumerate(sources, 1):
        where = " · ".join(part for part in (source["section"], source["location"]) if part)
        title = source["document_title"] or source["label"]
        label = title if source["kind"] == "source" else f"{source['label']} ({title})" if title else source["label"]
        line = f"{number}. [{source['id']}] {label}" + (f", {where}" if where else "")
        lines.append(line + (f" <{source['url']}>" if source["url"] else ""))
    return SOURCES_HEADING + "\n".join(lines)
