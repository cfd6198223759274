"""The Models page: staff connect model endpoints and pick the chat and embedding models
(knowledge/services/model_endpoints.py). Everyone else reads which models answer and who to ask."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from knowledge import selectors
from knowledge.models import ModelEndpoint
from knowledge.rag import llm
from knowledge.services import model_endpoints
from knowledge.services.model_endpoints import ModelSettingsError
from knowledge.web.forms import ModelEndpointForm, ModelKeyForm, ModelPickForm


def _staff(request) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("Only staff connect and pick models.")


def _back():
    return redirect("knowledge:models")


def _endpoint_rows(endpoints: list[ModelEndpoint], choices: dict) -> list[dict]:
    in_use = {choice.endpoint_id: [] for choice in choices.values()}
    for choice in choices.values():
        in_use[choice.endpoint_id].append(choice)
    return [
        {
            "endpoint": endpoint,
            "key": model_endpoints.key_state(endpoint),
            "in_use": in_use.get(endpoint.pk, []),
        }
        for endpoint in endpoints
    ]


def _page(request, form: ModelEndpointForm | None = None):
    choices = selectors.model_choices()
    context = {
        "engine": llm.engine_description(),
        "choices": choices,
        "environment": llm.environment_config(),
        "reembedding": selectors.latest_reembedding(),
    }
    if request.user.is_staff:
        context.update(
            endpoints=_endpoint_rows(selectors.model_endpoints(), choices),
            form=form or ModelEndpointForm(),
            key_form=ModelKeyForm(),
            ollama=model_endpoints.detect_ollama(),
        )
    return render(request, "knowledge/models.html", context, status=400 if form is not None else 200)


@login_required
@require_GET
def models_page(request):
    return _page(request)


@login_required
@require_GET
def reembedding_progress(request):
    return render(request, "knowledge/_reembedding.html", {"reembedding": selectors.latest_reembedding()})


def _report(request, endpoint: ModelEndpoint) -> None:
    if endpoint.check_error:
        messages.error(request, f"{endpoint.name}: {endpoint.check_error}")
    else:
        messages.success(request, f"{endpoint.name} answers and serves {len(endpoint.served_models)} model(s).")


@login_required
@require_POST
def endpoint_add(request):
    _staff(request)
    form = ModelEndpointForm(request.POST)
    if form.is_valid():
        try:
            _report(request, model_endpoints.endpoint_add(user=request.user, **form.cleaned_data))
            return _back()
        except ModelSettingsError as exc:
            form.add_error(None, str(exc))
    return _page(request, form)


@login_required
@require_POST
def ollama_connect(request):
    _staff(request)
    found = model_endpoints.detect_ollama()
    if found is None:
        messages.error(request, "No Ollama answers on this machine's default port any more.")
        return _back()
    try:
        endpoint = model_endpoints.endpoint_add(
            user=request.user, name="Ollama on this machine", kind=ModelEndpoint.Kind.OLLAMA, base_url=found.url
        )
    except ModelSettingsError as exc:
        messages.error(request, str(exc))
    else:
        _report(request, endpoint)
    return _back()


def _call(request, do, *, success: str = ""):
    try:
        result = do()
    except ObjectDoesNotExist as exc:
        raise Http404("No such endpoint or re-embedding.") from exc
    except ModelSettingsError as exc:
        messages.error(request, str(exc))
        return None
    if success:
        messages.success(request, success)
    return result


@login_required
@require_POST
def endpoint_check(request, pk):
    _staff(request)
    endpoint = _call(request, lambda: model_endpoints.endpoint_check(user=request.user, endpoint_id=pk))
    if endpoint is not None:
        _report(request, endpoint)
    return _back()


@login_required
@require_POST
def endpoint_key(request, pk):
    _staff(request)
    form = ModelKeyForm(request.POST)
    if form.is_valid():
        api_key = form.cleaned_data["api_key"]
        endpoint = _call(
            request, lambda: model_endpoints.endpoint_set_key(user=request.user, endpoint_id=pk, api_key=api_key)
        )
        if endpoint is not None:
            _report(request, endpoint)
    return _back()


@login_required
@require_POST
def endpoint_delete(request, pk):
    _staff(request)
    _call(request, lambda: model_endpoints.endpoint_delete(user=request.user, endpoint_id=pk), success="Removed.")
    return _back()


@login_required
@require_POST
def chat_pick(request):
    _staff(request)
    form = ModelPickForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(form.errors.get("__all__", ["Pick a model."])))
        return _back()
    endpoint_id, model = form.cleaned_data["endpoint"], form.cleaned_data["model"]
    if endpoint_id is None:
        _call(
            request,
            lambda: model_endpoints.chat_model_reset(user=request.user),
            success="Chat uses the environment's model again.",
        )
    else:
        _call(
            request,
            lambda: model_endpoints.chat_model_pick(user=request.user, endpoint_id=endpoint_id, model=model),
            success=f"{model} answers from now on.",
        )
    return _back()


@login_required
@require_POST
def embedding_pick(request):
    _staff(request)
    form = ModelPickForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(form.errors.get("__all__", ["Pick a model."])))
        return _back()
    endpoint_id, model = form.cleaned_data["endpoint"], form.cleaned_data["model"]
    reembedding = _call(
        request,
        lambda: model_endpoints.embedding_model_pick(user=request.user, endpoint_id=endpoint_id, model=model),
    )
    if reembedding is not None:
        messages.success(request, f"Embedding with {reembedding.model}; re-embedding {reembedding.total} rows.")
    return _back()


@login_required
@require_POST
def reembedding_retry(request, pk):
    _staff(request)
    _call(
        request,
        lambda: model_endpoints.reembedding_retry(user=request.user, reembedding_id=pk),
        success="Re-embedding again.",
    )
    return _back()
