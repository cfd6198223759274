"""Talking to a model server before it is in use: the models it serves, the size of its
vectors, and whether an Ollama runs on this machine.

An administrator tests an endpoint from the Models page, so every failure becomes an LLMError
whose message says what to fix (never the key). Ollama speaks two protocols: its own
(`/api/version`, `/api/tags`, read here as the `ollama` client package reads them) and the
OpenAI one under `/v1`, which chat and embeddings use like any other endpoint.
"""

from dataclasses import dataclass

import httpx
import openai

from knowledge.rag import llm
from knowledge.rag.llm.background import background

OLLAMA_DEFAULT_URL = "http://127.0.0.1:11434"
# A test from a page, not a model call: a server that takes longer is as good as down.
PROBE_TIMEOUT = 10.0
# Detection runs on every visit of the page; a closed port answers at once, a filtered one must not hang it.
DETECT_TIMEOUT = 1.0
PROBE_TEXT = "How many dimensions do these vectors have?"


def ollama_openai_url(root: str) -> str:
    """The OpenAI-compatible API of the Ollama server at `root`."""
    return root.rstrip("/") + "/v1"


@dataclass(frozen=True)
class Ollama:
    url: str
    version: str
    models: list[str]


def _ollama_models(payload: dict) -> list[str]:
    # The `ollama` client reads each entry's `model`; servers before 0.4 sent only `name`.
    rows = payload.get("models") or []
    return sorted({str(row.get("model") or row.get("name")) for row in rows if row.get("model") or row.get("name")})


def detect_ollama(url: str = "") -> Ollama | None:
    """The Ollama server at `url` (by default the one on this machine), or None if none answers."""
    root = (url or OLLAMA_DEFAULT_URL).rstrip("/")
    try:
        with httpx.Client(timeout=DETECT_TIMEOUT) as client:
            version = client.get(f"{root}/api/version")
            version.raise_for_status()
            tags = client.get(f"{root}/api/tags")
            tags.raise_for_status()
            return Ollama(root, str(version.json().get("version", "")), _ollama_models(tags.json()))
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def _ollama_tags(root: str, name: str) -> list[str]:
    where = llm._where(root)
    try:
        with httpx.Client(timeout=PROBE_TIMEOUT) as client:
            response = client.get(f"{root.rstrip('/')}/api/tags")
    except httpx.HTTPError as exc:
        raise llm.LLMError(f"Could not reach the Ollama server {name!r} at {where} ({exc}). Is it running?") from exc
    if response.status_code != 200:
        raise llm.LLMError(
            f"The Ollama server {name!r} at {where} answered {response.status_code} to /api/tags: "
            f"{llm._short(response.text)}"
        )
    try:
        return _ollama_models(response.json())
    except (ValueError, AttributeError) as exc:
        raise llm.LLMError(f"{where} does not answer /api/tags as an Ollama server does.") from exc


def _probe_client(base_url: str, api_key: str) -> openai.AsyncOpenAI:
    timeout = httpx.Timeout(PROBE_TIMEOUT)
    return openai.AsyncOpenAI(
        base_url=base_url or None,
        api_key=api_key or "unused",
        timeout=timeout,
        max_retries=0,
        http_client=httpx.AsyncClient(verify=llm._ssl_context(), timeout=timeout),
    )


def _endpoint(name: str, base_url: str, api_key: str, model: str = "") -> "llm._Endpoint":
    if api_key:
        llm._keys_seen.add(api_key)
    return llm._Endpoint(f"endpoint {name!r}", "", base_url, api_key, model)


def list_models(*, name: str, kind: str, base_url: str, api_key: str) -> list[str]:
    """The models the endpoint serves, sorted; an LLMError that says what is wrong otherwise. For
    an OpenAI-compatible server this also proves the key: /models needs it."""
    if kind == "ollama":
        return _ollama_tags(base_url, name)
    endpoint = _endpoint(name, base_url, api_key)

    async def fetch() -> list[str]:
        client = _probe_client(base_url, api_key)
        try:
            return sorted({model.id async for model in client.models.list()})
        finally:
            await client.close()

    try:
        return background.run(fetch())
    except openai.OpenAIError as exc:
        raise llm.LLMError(llm._describe(exc, endpoint)) from exc


def embedding_dimensions(*, name: str, base_url: str, api_key: str, model: str) -> int:
    """The size of the vectors `model` makes, from one embedding of a short text."""
    config = llm.EndpointConfig(base_url, api_key, model)
    _endpoint(name, base_url, api_key, model)
    try:
        vectors, _ = background.run(llm._embed_remote([PROBE_TEXT], "passage", config, dimensions=None))
    except llm.LLMError as exc:
        raise llm.LLMError(f"{model!r} at {llm._where(base_url)} made no embedding: {exc}") from exc
    return len(vectors[0])


def chat_works(*, name: str, base_url: str, api_key: str, model: str) -> None:
    """One short completion from `model`, so a model that only embeds is not picked for chat."""
    endpoint = _endpoint(name, base_url, api_key, model)

    async def ask() -> None:
        client = _probe_client(base_url, api_key)
        try:
            await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Say OK."}], max_tokens=5
            )
        finally:
            await client.close()

    try:
        background.run(ask())
    except openai.OpenAIError as exc:
        raise llm.LLMError(llm._describe(exc, endpoint)) from exc
