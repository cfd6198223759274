"""Citations, written once: the markers an answer cites ([S2], [E1], [R3], [S2, E1]), the source
sentence each marker vouches for, and the link that opens the cited passage in its document.

The answer, the chat (socket and page), the OpenAI and Ollama APIs, MCP and the `query`
command all read markers and build links here, so they cannot disagree.
"""

import re
from collections.abc import Sequence
from urllib.parse import urlencode

from django.urls import reverse

from knowledge.rag.answer.reading import chunk_sentences, content_terms
from knowledge.rag.retrieval import ChunkRow, RetrievalResult
from knowledge.rag.sentences import Sentence, sentences

# [S2], [E1], [R3] and lists such as [S2, E1] or [S2; S3], as the answer prompt asks.
CITATION_RE = re.compile(r"\[((?:[SER]\d+)(?:\s*[,;]\s*[SER]\d+)*)\]")
CITATION_ID_RE = re.compile(r"[SER]\d+")


def answer_citations(answer: str, result: RetrievalResult) -> list[dict]:
    """The retrieval's citations, each with the source sentences the answer cites it for.

    For each marker ([S2], or [E1] and [R3] when their chunk is among the sources), the cited
    sentence is the one of that chunk which the answer quotes right before the marker (an
    extractive answer always does, so there it is exact); otherwise the one sharing the most
    content terms with the answer sentence that carries the marker. `sentences` lists every
    sentence a row is cited for, in the answer's order; `sentence`, `sentence_start` and
    `sentence_end` are the first of them, with spans into the document's text.
    """
    chunks = {row.chunk_id: row for row in result.chunks}
    rows = {citation["id"]: chunks.get(citation["chunk_id"]) for citation in result.citations}
    claims = sentences(answer)
    cited: dict[str, list[Sentence]] = {}
    for match in CITATION_RE.finditer(answer):
        quoted = " ".join(answer[: match.start()].split())
        claim = _claim(answer, claims, match.start())
        for row_id in CITATION_ID_RE.findall(match.group(1)):
            row = rows.get(row_id)
            found = _supporting_sentence(row, quoted, claim) if row is not None else None
            if found is not None and found not in cited.setdefault(row_id, []):
                cited[row_id].append(found)
    return [{**citation, **_sentence_fields(cited.get(citation["id"], []))} for citation in result.citations]


def _claim(answer: str, claims: Sequence[Sentence], position: int) -> str:
    """The answer's words a marker at `position` vouches for: its sentence, or the sentence
    before when the marker opens one (a marker after the full stop, "... Erin. [S3]")."""
    before = [claim for claim in claims if claim.start < position]
    for claim in reversed(before):
        if CITATION_RE.sub("", answer[claim.start : position]).strip():
            return CITATION_RE.sub("", answer[claim.start : max(position, claim.end)])
    return CITATION_RE.sub("", answer[:position].rsplit("\n", 1)[-1])


def _supporting_sentence(row: ChunkRow, quoted: str, claim: str) -> Sentence | None:
    options = chunk_sentences(row.text, row.char_start)
    exact = [read.sentence for read in options if quoted.endswith(read.sentence.text)]
    if exact:
        return max(exact, key=lambda sentence: len(sentence.text))
    wanted = content_terms(claim)
    best, best_key = None, (0, 0, False)
    for read in options:
        key = (len(wanted & read.about), len(wanted & read.terms), read.sentence.complete)
        if key[0] and key > best_key:
            best, best_key = read.sentence, key
    return best


def _sentence_fields(found: Sequence[Sentence]) -> dict:
    first = found[0] if found else None
    return {
        "sentence": first.text if first else None,
        "sentence_start": first.start if first else None,
        "sentence_end": first.end if first else None,
        "sentences": [{"text": s.text, "start": s.start, "end": s.end} for s in found],
    }


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
