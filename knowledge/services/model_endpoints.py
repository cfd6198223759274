"""Model endpoints connected in the browser: add, test, pick, switch, re-embed.

Staff connect OpenAI-compatible or Ollama servers on the Models page and pick one model for
chat and one for embeddings (decision 0150). The pick is installation-wide and takes effect in
every process without a restart: `active_config` is the model provider of `knowledge.rag.llm`
(set in `KnowledgeConfig.ready`). It keeps the picks in memory under a version stored in Redis,
which every change replaces after its commit; a process compares versions on each model call
(one Redis GET) and reads the two rows again only when the version moved. With nothing picked,
the environment's LLM_* and EMBEDDING_* settings answer, as before.

Keys are encrypted with Fernet under a key derived from SECRET_KEY (decision 0151) and leave
this module only inside the model configuration handed to `knowledge.rag.llm`.
"""

import asyncio
import base64
import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from celery import current_app
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.cache import cache
from django.db import connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from knowledge.models import Chunk, Document, Entity, ModelChoice, ModelEndpoint, Reembedding, Relation, Workspace
from knowledge.rag import graph, llm
from knowledge.rag.llm import servers

logger = logging.getLogger(__name__)

VERSION_KEY = "model-endpoints:version"
REEMBED_TASK = "knowledge.tasks.reembed_all"
UNREADABLE_KEY = "The key cannot be read since SECRET_KEY changed; enter it again."
CHAT = ModelChoice.Purpose.CHAT
EMBEDDING = ModelChoice.Purpose.EMBEDDING


class ModelSettingsError(Exception):
    """A change the Models page cannot make; the message says why and what to do."""


# ---------------------------------------------------------------------------------------
# Keys


def _fernet() -> Fernet:
    # HKDF with its own label, so this key is not SECRET_KEY itself nor any other key derived from it.
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"graphrag-teams model endpoint keys").derive(
        settings.SECRET_KEY.encode()
    )
    return Fernet(base64.urlsafe_b64encode(derived))


def _encrypt(api_key: str) -> str:
    return _fernet().encrypt(api_key.encode()).decode() if api_key else ""


def _decrypt(token: str) -> str | None:
    """The key, "" when none was given, None when SECRET_KEY changed since it was stored."""
    if not token:
        return ""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        return None


def key_state(endpoint: ModelEndpoint) -> str:
    """What the page may say about an endpoint's key: "set", "none" or "unreadable"."""
    key = _decrypt(endpoint.api_key_encrypted)
    return "unreadable" if key is None else ("set" if key else "none")


# ---------------------------------------------------------------------------------------
# The provider every process reads


_cached: tuple[str, dict] | None = None
_cached_lock = threading.Lock()


def _version() -> str | None:
    try:
        version = cache.get(VERSION_KEY)
        if version is None:
            # Redis was emptied (or never held one): a new version makes every process read again.
            cache.add(VERSION_KEY, uuid.uuid4().hex, timeout=None)
            version = cache.get(VERSION_KEY)
        return version
    except Exception:  # Redis down: model calls go on with what this process knows
        logger.warning("could not read the model settings version from Redis", exc_info=True)
        return None


def _bump_version() -> None:
    global _cached
    _cached = None
    cache.set(VERSION_KEY, uuid.uuid4().hex, timeout=None)


def _changed() -> None:
    """This process reads the picks again at once; the others after the change commits."""
    global _cached
    _cached = None
    transaction.on_commit(_bump_version)


def _openai_url(endpoint: ModelEndpoint) -> str:
    if endpoint.kind == ModelEndpoint.Kind.OLLAMA:
        return servers.ollama_openai_url(endpoint.base_url)
    return endpoint.base_url


def _endpoint_config(choice: ModelChoice) -> llm.EndpointConfig:
    key = _decrypt(choice.endpoint.api_key_encrypted)
    # An unreadable key (SECRET_KEY changed) is sent as none: the server's refusal names the Models page.
    return llm.EndpointConfig(_openai_url(choice.endpoint), key or "", choice.model, "", choice.dimensions)


def _load() -> dict:
    return {choice.purpose: _endpoint_config(choice) for choice in ModelChoice.objects.select_related("endpoint")}


def _load_outside_event_loop() -> dict:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        if threading.current_thread() is threading.main_thread():
            return _load()

    # Async callers (the chat socket) may not use the ORM on the loop's thread, and a helper
    # thread that lives as long as the process (the query-embedding batcher) would keep the
    # connection it opened for this read for good: an idle session that outlives a database
    # restart and holds the database against a DROP. The read happens once per change of the
    # settings, so a short-lived thread (closing its connection) is enough.
    def load_and_close() -> dict:
        try:
            return _load()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-settings") as pool:
        return pool.submit(load_and_close).result()


def active_config() -> llm.ModelConfig:
    """The models in use: those picked on the Models page, else the environment's."""
    global _cached
    version = _version()
    cached = _cached
    if cached is None or (version is not None and cached[0] != version):
        with _cached_lock:
            cached = _cached
            if cached is None or (version is not None and cached[0] != version):
                cached = _cached = (version or "", _load_outside_event_loop())
    picked = cached[1]
    environment = llm.environment_config()
    return llm.ModelConfig(
        chat=picked.get(CHAT) or environment.chat,
        embedding=picked.get(EMBEDDING) or environment.embedding,
    )


# ---------------------------------------------------------------------------------------
# Endpoints


def _check_staff(user) -> None:
    if not (user.is_active and user.is_staff):
        raise PermissionError("Only staff connect and pick models.")


def _clean_url(base_url: str) -> str:
    base_url = base_url.strip().rstrip("/")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ModelSettingsError(f"{base_url!r} is not an http:// or https:// address.")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ModelSettingsError("Give the address without credentials, query or fragment; the key has its own field.")
    return base_url


def endpoint_add(*, user, name: str, kind: str, base_url: str, api_key: str = "") -> ModelEndpoint:
    """A new endpoint, tested at once (its models listed, or what went wrong kept on it)."""
    _check_staff(user)
    name = name.strip()
    if not name:
        raise ModelSettingsError("Give the endpoint a name.")
    if kind not in ModelEndpoint.Kind.values:
        raise ModelSettingsError(f"Unknown kind {kind!r}: use {' or '.join(ModelEndpoint.Kind.values)}.")
    if ModelEndpoint.objects.filter(name__iexact=name).exists():
        raise ModelSettingsError(f"An endpoint named {name!r} exists already.")
    endpoint = ModelEndpoint.objects.create(
        name=name,
        kind=kind,
        base_url=_clean_url(base_url),
        api_key_encrypted=_encrypt(api_key.strip()),
        created_by=user,
    )
    logger.info("%s added model endpoint %r (%s at %s)", user, endpoint.name, kind, endpoint.base_url)
    return endpoint_check(user=user, endpoint_id=endpoint.pk)


def endpoint_check(*, user, endpoint_id: int) -> ModelEndpoint:
    """Test the connection: list the models the endpoint serves, or keep the reason it failed."""
    _check_staff(user)
    endpoint = ModelEndpoint.objects.get(pk=endpoint_id)
    key = _decrypt(endpoint.api_key_encrypted)
    if key is None:
        endpoint.served_models, endpoint.check_error = [], UNREADABLE_KEY
    else:
        try:
            endpoint.served_models = servers.list_models(
                name=endpoint.name, kind=endpoint.kind, base_url=endpoint.base_url, api_key=key
            )
            endpoint.check_error = "" if endpoint.served_models else "The endpoint answered but serves no models."
        except llm.LLMError as exc:
            endpoint.served_models, endpoint.check_error = [], str(exc)
    endpoint.checked_at = timezone.now()
    endpoint.save(update_fields=["served_models", "check_error", "checked_at"])
    if endpoint.check_error:
        logger.warning("model endpoint %r failed its test: %s", endpoint.name, endpoint.check_error)
    return endpoint


def endpoint_set_key(*, user, endpoint_id: int, api_key: str) -> ModelEndpoint:
    """Replace the endpoint's key (empty: none), then test it."""
    _check_staff(user)
    with transaction.atomic():
        updated = ModelEndpoint.objects.filter(pk=endpoint_id).update(api_key_encrypted=_encrypt(api_key.strip()))
        if not updated:
            raise ModelEndpoint.DoesNotExist
        _changed()
    return endpoint_check(user=user, endpoint_id=endpoint_id)


def endpoint_delete(*, user, endpoint_id: int) -> None:
    _check_staff(user)
    endpoint = ModelEndpoint.objects.get(pk=endpoint_id)
    in_use = list(endpoint.choices.values_list("purpose", flat=True))
    if in_use:
        raise ModelSettingsError(
            f"{endpoint.name!r} serves the {' and '.join(sorted(in_use))} model; pick another one (or the "
            "environment's) first."
        )
    endpoint.delete()


def detect_ollama() -> servers.Ollama | None:
    """The Ollama on this machine's default port, unless an endpoint for it exists already."""
    found = servers.detect_ollama()
    if found is None or ModelEndpoint.objects.filter(kind=ModelEndpoint.Kind.OLLAMA, base_url=found.url).exists():
        return None
    return found


# ---------------------------------------------------------------------------------------
# Picking models


def _usable_key(endpoint: ModelEndpoint) -> str:
    key = _decrypt(endpoint.api_key_encrypted)
    if key is None:
        raise ModelSettingsError(f"{endpoint.name!r}: {UNREADABLE_KEY}")
    return key


def chat_model_pick(*, user, endpoint_id: int, model: str) -> ModelChoice:
    """Answer with `model` from now on, in every process, once it has answered one short question."""
    _check_staff(user)
    endpoint = ModelEndpoint.objects.get(pk=endpoint_id)
    try:
        key = _usable_key(endpoint)
        servers.chat_works(name=endpoint.name, base_url=_openai_url(endpoint), api_key=key, model=model)
    except llm.LLMError as exc:
        raise ModelSettingsError(f"{model!r} did not answer a test question: {exc}") from exc
    with transaction.atomic():
        choice, _ = ModelChoice.objects.update_or_create(
            purpose=CHAT, defaults={"endpoint": endpoint, "model": model, "dimensions": None, "chosen_by": user}
        )
        _changed()
    logger.info("%s picked chat model %r at %r", user, model, endpoint.name)
    return choice


def chat_model_reset(*, user) -> None:
    """Back to the environment's chat model (or none)."""
    _check_staff(user)
    with transaction.atomic():
        ModelChoice.objects.filter(purpose=CHAT).delete()
        _changed()


def _ingesting() -> int:
    return Document.objects.filter(status__in=[Document.Status.PENDING, Document.Status.PROCESSING]).count()


def _vectors_to_embed() -> int:
    return (
        Chunk.objects.filter(Q(document__status=Document.Status.PROCESSED) | Q(embedding__isnull=False)).count()
        + Entity.objects.published().count()
        + Relation.objects.published().count()
    )


def embedding_model_pick(*, user, endpoint_id: int | None, model: str = "") -> Reembedding:
    """Embed with `model` at the endpoint (None: the environment's embedding model) from now on,
    and re-embed everything stored, on a worker. A change of dimension resizes the vector columns
    in the same transaction as the pick, so no search ever compares vectors of two sizes; it is
    refused while documents are ingesting, whose vectors have the old size."""
    _check_staff(user)
    if Reembedding.objects.filter(status=Reembedding.Status.RUNNING).exists():
        raise ModelSettingsError("A re-embedding is running; pick again once it has finished.")
    if endpoint_id is None:
        environment = llm.environment_config().embedding
        label = f"{environment.model} (environment)" if environment else llm.EMBEDDED_EMBEDDING_MODEL
        dimensions = settings.EMBEDDING_DIM if environment else llm.EMBEDDED_EMBEDDING_DIM
        endpoint = None
    else:
        endpoint = ModelEndpoint.objects.get(pk=endpoint_id)
        try:
            dimensions = servers.embedding_dimensions(
                name=endpoint.name, base_url=_openai_url(endpoint), api_key=_usable_key(endpoint), model=model
            )
        except llm.LLMError as exc:
            raise ModelSettingsError(f"{model!r} could not embed a test sentence: {exc}") from exc
        label = f"{model} at {endpoint.name}"
    with transaction.atomic():
        resize = graph.vector_dimensions() != dimensions
        if resize:
            ingesting = _ingesting()
            if ingesting:
                stored = graph.vector_dimensions()
                raise ModelSettingsError(
                    f"{label} makes {dimensions}-dimensional vectors, the stored ones have {stored}: changing "
                    f"that waits until the {ingesting} document(s) being ingested are done."
                )
        if resize:
            # First in the transaction: Postgres alters no table with pending trigger events.
            graph.resize_vector_columns(dimensions)
        if endpoint is None:
            ModelChoice.objects.filter(purpose=EMBEDDING).delete()
        else:
            ModelChoice.objects.update_or_create(
                purpose=EMBEDDING,
                defaults={"endpoint": endpoint, "model": model, "dimensions": dimensions, "chosen_by": user},
            )
        # Counted after a resize emptied the vectors: chunks are counted by their document.
        reembedding = Reembedding.objects.create(
            model=label, dimensions=dimensions, total=_vectors_to_embed(), started_by=user
        )
        _changed()
        transaction.on_commit(lambda: current_app.send_task(REEMBED_TASK, args=[reembedding.pk]))
    logger.info("%s picked embedding model %s (%d dimensions); re-embedding", user, label, dimensions)
    return reembedding


def reembedding_run(*, reembedding_id: int) -> Reembedding:
    """Embed every published chunk, entity and relation again with the embedding model in use,
    counting progress on the row as it goes (the page polls it). Running it again starts over."""
    Reembedding.objects.filter(pk=reembedding_id).update(done=0)

    def count(done: int) -> None:
        Reembedding.objects.filter(pk=reembedding_id).update(done=F("done") + done)

    try:
        for workspace_id in Workspace.objects.order_by("pk").values_list("pk", flat=True):
            graph.reembed_workspace(workspace_id=workspace_id, on_page=count)
    except llm.LLMError as exc:
        logger.warning("re-embedding %s failed: %s", reembedding_id, exc)
        Reembedding.objects.filter(pk=reembedding_id).update(
            status=Reembedding.Status.FAILED, error=str(exc)[:2000], finished_at=timezone.now()
        )
    else:
        Reembedding.objects.filter(pk=reembedding_id).update(
            status=Reembedding.Status.FINISHED, finished_at=timezone.now()
        )
    return Reembedding.objects.get(pk=reembedding_id)


def reembedding_retry(*, user, reembedding_id: int) -> None:
    """Send a stopped or failed re-embedding to a worker again."""
    _check_staff(user)
    Reembedding.objects.get(pk=reembedding_id)
    if Reembedding.objects.filter(status=Reembedding.Status.RUNNING).exclude(pk=reembedding_id).exists():
        raise ModelSettingsError("Another re-embedding is running.")
    Reembedding.objects.filter(pk=reembedding_id).exclude(status=Reembedding.Status.FINISHED).update(
        status=Reembedding.Status.RUNNING, error="", finished_at=None
    )
    current_app.send_task(REEMBED_TASK, args=[reembedding_id])
