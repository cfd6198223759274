"""An optional reranker: a cross-encoder behind the /rerank API that vLLM, TEI, Infinity, Jina
and Cohere serve. Off unless RERANK_BASE_URL is set.

The request carries the documents both as `documents` (Cohere, Jina, vLLM, Infinity) and as
`texts` (Hugging Face TEI); the answer is read in either shape: `{"results": [{"index",
"relevance_score"}]}` or TEI's bare `[{"index", "score"}]`.
"""

import logging

import httpx
from django.conf import settings

logger = logging.getLogger(__name__)


class RerankError(Exception):
    """The reranker failed or answered something unreadable; the message names the setting to check."""


def rerank_configured() -> bool:
    return bool(settings.RERANK_BASE_URL)


def rerank(query: str, documents: list[str]) -> list[tuple[int, float]]:
    """(index into `documents`, relevance score) for every document, most relevant first."""
    if not documents:
        return []
    url = settings.RERANK_BASE_URL.rstrip("/") + "/rerank"
    headers = {"Authorization": f"Bearer {settings.RERANK_API_KEY}"} if settings.RERANK_API_KEY else {}
    body = {"query": query, "documents": documents, "texts": documents, "top_n": len(documents)}
    if settings.RERANK_MODEL:
        body["model"] = settings.RERANK_MODEL
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=settings.RERANK_TIMEOUT)
    except httpx.HTTPError as exc:
        raise RerankError(f"The reranker at RERANK_BASE_URL ({url}) could not be reached: {exc}.") from exc
    if response.status_code >= 400:
        raise RerankError(
            f"The reranker at RERANK_BASE_URL ({url}) answered {response.status_code}: {response.text[:300]}. "
            "Check RERANK_MODEL and RERANK_API_KEY."
        )
    try:
        data = response.json()
        results = data["results"] if isinstance(data, dict) else data
        scored = [(int(item["index"]), float(item.get("relevance_score", item.get("score")))) for item in results]
    except (ValueError, KeyError, TypeError) as exc:
        raise RerankError(f"The reranker at RERANK_BASE_URL ({url}) answered something unreadable: {exc}.") from exc
    if sorted(index for index, _ in scored) != list(range(len(documents))):
        raise RerankError(f"The reranker at RERANK_BASE_URL ({url}) did not score every document once.")
    return sorted(scored, key=lambda pair: (-pair[1], pair[0]))
