"""Which context rows an answer cites, and where each cited passage is shown.

Shared by the chat's rendering and the OpenAI and Ollama APIs, which list an answer's sources
for clients that cannot show our sources panel.
"""

from urllib.parse import urlencode

from django.urls import reverse

from knowledge.answer import CITATION_ID_RE, CITATION_RE


def cited_ids(content: str) -> list[str]:
    """The context rows an answer cites (its `[S2]`-style markers), in the order it first cites them."""
    ids = [found for match in CITATION_RE.finditer(content) for found in CITATION_ID_RE.findall(match.group(1))]
    return list(dict.fromkeys(ids))


def citation_href(citation: dict, *, workspace_slug: str) -> str:
    """The cited passage inside its document: the chunk shaded and, when known, the sentence marked."""
    if not citation.get("document_id") or not citation.get("chunk_id"):
        return ""
    query = {"chunk": int(citation["chunk_id"])}
    if isinstance(citation.get("sentence_start"), int) and isinstance(citation.get("sentence_end"), int):
        query.update(start=citation["sentence_start"], end=citation["sentence_end"])
    url = reverse("knowledge:document", args=[workspace_slug, int(citation["document_id"])])
    return f"{url}?{urlencode(query)}#chunk-{int(citation['chunk_id'])}"
