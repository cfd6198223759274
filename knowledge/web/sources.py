"""The sources of a workspace: the list (and adding one, for owners), a source's page with its last
and next sync, counts, errors and documents, "sync now" for editors, and removing one."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from knowledge import selectors
from knowledge.models import Role
from knowledge.services import sources as syncing
from knowledge.web.forms import SourceForm
from knowledge.web.views import _context, _workspace


@login_required
@require_http_methods(["GET", "POST"])
def sources(request, slug):
    workspace = _workspace(request, slug, Role.OWNER if request.method == "POST" else Role.VIEWER)
    form = SourceForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            source = syncing.source_create(workspace=workspace, actor=request.user, **form.cleaned_data)
        except syncing.SourceError as err:
            form.add_error("location", str(err))
        else:
            syncing.source_sync_request(source=source)
            messages.success(request, f"Added “{source.name}”; its first sync is under way.")
            return redirect("knowledge:source", slug=workspace.slug, pk=source.pk)
    context = _context(workspace, sources=selectors.sources_of(workspace=workspace), form=form)
    return render(request, "knowledge/sources.html", context, status=400 if form.errors else 200)


@login_required
@require_GET
def source(request, slug, pk):
    workspace = _workspace(request, slug)
    found = get_object_or_404(selectors.sources_of(workspace=workspace), pk=pk)
    context = _context(workspace, source=found, documents=selectors.source_documents(source=found))
    return render(request, "knowledge/source.html", context)


@login_required
@require_POST
def source_sync(request, slug, pk):
    workspace = _workspace(request, slug, Role.EDITOR)
    found = get_object_or_404(workspace.sources, pk=pk)
    if syncing.source_sync_request(source=found):
        messages.success(request, f"Syncing “{found.name}” now.")
    else:
        messages.info(request, f"“{found.name}” is being synced already.")
    return redirect("knowledge:source", slug=workspace.slug, pk=found.pk)


@login_required
@require_POST
def source_delete(request, slug, pk):
    workspace = _workspace(request, slug, Role.OWNER)
    found = get_object_or_404(workspace.sources, pk=pk)
    syncing.source_delete(source=found, actor=request.user)
    messages.success(request, f"Removed “{found.name}”; the documents it brought stay.")
    return redirect("knowledge:sources", slug=workspace.slug)
