import logging
import re
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import Http404, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import get_language_info
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from knowledge import selectors
from knowledge.models import ROLE_RANK, Document, Membership, Role, Workspace
from knowledge.rag import llm, parsing
from knowledge.services import events, export, ingestion, invitations, ratelimits, scopes, workspaces
from knowledge.web.forms import (
    DocumentLabelForm,
    DocumentReplaceForm,
    InviteForm,
    MemberAddForm,
    MemberRoleForm,
    UploadForm,
    WorkspaceCreateForm,
    WorkspaceSettingsForm,
)

logger = logging.getLogger(__name__)

ENTITIES_PER_PAGE = 50
DOCUMENTS_PER_PAGE = 100
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
GRAPH_DEFAULT_NODES = 300
GRAPH_MAX_NODES = 2000


def _workspace(request, slug: str, min_role: str = Role.VIEWER) -> Workspace:
    """The workspace for this user: 404 for non-members, 403 for members whose role is too low
    (they already know the workspace exists, so saying "not allowed" leaks nothing)."""
    workspace = selectors.workspace_for_user(request.user, slug)
    if ROLE_RANK[workspace.role] < ROLE_RANK[min_role]:
        raise PermissionDenied(f"This needs the {min_role} role in {workspace.name}.")
    return workspace


def _posted(request):
    # A POST with an empty body is still a submission: it must be validated, not shown as a blank form.
    return request.POST if request.method == "POST" else None


def _can(workspace: Workspace, role: str) -> bool:
    return ROLE_RANK[workspace.role] >= ROLE_RANK[role]


def _context(workspace: Workspace, **extra) -> dict:
    return {
        "workspace": workspace,
        "upload_max_mb": settings.UPLOAD_MAX_MB,
        "can_edit": _can(workspace, Role.EDITOR),
        "is_owner": _can(workspace, Role.OWNER),
        **extra,
    }


@login_required
def home(request):
    workspaces = selectors.workspaces_for_user(request.user).order_by("name")
    return render(request, "knowledge/home.html", {"workspaces": workspaces})


@login_required
@require_http_methods(["GET", "POST"])
def workspace_new(request):
    form = WorkspaceCreateForm(_posted(request))
    if request.method == "POST" and form.is_valid():
        try:
            workspace = workspaces.workspace_create(user=request.user, **form.cleaned_data)
        except workspaces.MembershipError as err:
            form.add_error(None, str(err))
        else:
            messages.success(request, f"Created {workspace.name}. Upload documents to build its graph.")
            return redirect("knowledge:workspace", slug=workspace.slug)
    return render(request, "knowledge/workspace_new.html", {"form": form}, status=400 if form.errors else 200)


@login_required
@require_GET
def workspace(request, slug):
    workspace = _workspace(request, slug)
    statuses = dict(workspace.documents.current().order_by().values_list("status").annotate(n=Count("*")))
    context = _context(
        workspace,
        statuses=[(label, statuses.get(value, 0)) for value, label in Document.Status.choices],
        document_total=sum(statuses.values()),
        engine=llm.engine_description(),
        member_count=workspace.memberships.count(),
        recent_documents=workspace.documents.current().defer("text")[:5],
    )
    return render(request, "knowledge/workspace.html", context)


@login_required
@require_GET
def documents(request, slug):
    workspace = _workspace(request, slug)
    status = request.GET.get("status", "")
    status = status if status in Document.Status.values else ""
    query = request.GET.get("q", "").strip()
    documents = selectors.documents_browse(workspace=workspace, status=status, query=query)
    page = Paginator(documents, DOCUMENTS_PER_PAGE).get_page(request.GET.get("page"))
    # Rendered from the same payload as live updates, so a row looks the same either way.
    waiting = events.work_waiting()
    rows = [
        events.document_payload(document, reference=events.workspace_pace(workspace.pk), waiting=waiting)
        for document in page
    ]
    counts = selectors.document_status_counts(workspace=workspace)
    context = _context(
        workspace,
        page=page,
        rows=rows,
        status=status,
        query=query,
        statuses=[(value, label, counts.get(value, 0)) for value, label in Document.Status.choices],
        document_total=sum(counts.values()),
        query_string=urlencode({"status": status, "q": query}),
    )
    return render(request, "knowledge/documents.html", context)


def _upload_one(request, workspace, *, filename: str, shown: str | None = None, **content) -> dict:
    """One file's (or the pasted text's) outcome, as the page lists it and the JSON answer says it;
    `shown` is the file's path in its folder when it came from one."""
    shown = shown or filename
    try:
        document = ingestion.document_create(workspace=workspace, user=request.user, filename=filename, **content)
    except ingestion.DocumentRejected as err:
        return _rejected(shown, err)
    queued = f"version {document.version} of" if document.version > 1 else "as"
    return {
        "name": shown,
        "level": "success",
        "message": f"{shown}: queued {queued} “{document.title}”.",
        "document": {
            "id": document.pk,
            "title": document.title,
            "url": reverse("knowledge:document", args=[workspace.slug, document.pk]),
        },
    }


def _upload_name(path: str, name: str, uploaded) -> tuple[str, str]:
    """(the file's path inside the folder it was dropped from, its own name). The page's script
    sends the name as the browser has it, since Django's multipart parser cuts a name at a slash
    or backslash (`<b>a</b>.txt` would arrive as `b>.txt`); without it the name is the parser's."""
    own = name or uploaded.name
    if path == own or not path:
        return own, own
    if path.endswith("/" + own):
        folder = path[: -len(own) - 1]
    else:
        # A page that sent no name: the path's last part is the file's.
        folder, _, own = path.replace("\\", "/").rpartition("/")
    parts = [
        part for part in _CONTROL_CHARS.sub("?", folder).replace("\\", "/").split("/") if part not in ("", ".", "..")
    ]
    return ("/".join([*parts, own])[:300] if parts else own), own


def _rejected(name: str, err: Exception) -> dict:
    return {"name": name, "level": "error", "message": str(err)}  # the message names the file already


def _upload_results(request, workspace, form) -> list[dict]:
    results = []
    tags = form.cleaned_data["tags"]
    paths, names = request.POST.getlist("path"), request.POST.getlist("name")
    for index, uploaded in enumerate(form.cleaned_data["files"]):
        shown, own = _upload_name(
            paths[index] if index < len(paths) else "", names[index] if index < len(names) else "", uploaded
        )
        try:
            # Checked before reading, so an oversized file is never read, parsed or stored.
            ingestion.check_upload_size(shown, uploaded.size)
        except ingestion.DocumentRejected as err:
            results.append(_rejected(shown, err))
            continue
        # A file from a folder is titled by its path there; the document's file name is its own.
        title = shown if shown != own else None
        results.append(
            _upload_one(request, workspace, filename=own, shown=shown, data=uploaded.read(), title=title, tags=tags)
        )
    text = form.cleaned_data["text"]
    if text.strip():
        title = form.cleaned_data["title"].strip() or None
        results.append(
            _upload_one(request, workspace, filename=title or "Pasted text", text=text, title=title, tags=tags)
        )
    return results


def _wants_json(request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


@login_required
@require_http_methods(["GET", "POST"])
def upload(request, slug):
    """Files and pasted text. The page's script sends one file per request and reads the JSON
    outcome (its progress bars need one request per file); without script the form posts
    everything at once and the outcomes are listed once, on this page or on the document list."""
    workspace = _workspace(request, slug, Role.EDITOR)
    form = UploadForm(_posted(request), request.FILES if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            count = len(form.cleaned_data["files"]) + bool(form.cleaned_data["text"].strip())
            ratelimits.rate_limit_check(limit="RATE_LIMIT_UPLOAD", user=request.user, count=count)
        except ratelimits.RateLimited as limited:
            return _uploads_refused(request, workspace, form, limited)
        results = _upload_results(request, workspace, form)
        if _wants_json(request):
            return JsonResponse({"results": results})
        if all(result["level"] == "success" for result in results):
            for result in results:
                messages.success(request, result["message"])
            return redirect("knowledge:documents", slug=workspace.slug)
        return render(request, "knowledge/upload.html", _context(workspace, form=UploadForm(), results=results))
    if request.method == "POST" and _wants_json(request):
        problems = " ".join(error for errors in form.errors.values() for error in errors)
        return JsonResponse({"error": problems}, status=400)
    status = 400 if form.errors else 200
    return render(request, "knowledge/upload.html", _context(workspace, form=form), status=status)


def _uploads_refused(request, workspace, form, limited: ratelimits.RateLimited) -> HttpResponse:
    if _wants_json(request):
        response = JsonResponse({"error": str(limited)}, status=429)
    else:
        form.add_error(None, str(limited))
        response = render(request, "knowledge/upload.html", _context(workspace, form=form), status=429)
    response["Retry-After"] = str(limited.retry_after)
    return response


def _document(workspace: Workspace, pk: int) -> Document:
    return get_object_or_404(workspace.documents, pk=pk)


@login_required
@require_GET
def document(request, slug, pk):
    workspace = _workspace(request, slug)
    document = _document(workspace, pk)
    chunk = None
    if request.GET.get("chunk", "").isdigit():
        chunk = document.chunks.defer("embedding").filter(pk=int(request.GET["chunk"])).first()
    structure = parsing.ParsedDocument.from_json(document.text, document.structure)
    sentence = _sentence_span(request, chunk) if chunk is not None else None
    context = _context(
        workspace,
        document=document,
        chunk=chunk,
        parts=_document_parts(structure, chunk, sentence),
        sentence=sentence is not None and sentence[0] < sentence[1],
        outline=[(len(s.path), f"section-{i}", s.path[-1]) for i, s in enumerate(structure.sections, 1)],
        regions=[(f"{r.kind}-{r.number}", r.name or f"{r.kind} {r.number}") for r in structure.regions],
        language=structure.language,
        written_in=_language_name(document.language),
        versions=ingestion.versions_of(document=document),
        label_form=DocumentLabelForm(initial={"tags": ", ".join(document.tags), "enabled": document.enabled}),
        replace_form=DocumentReplaceForm(),
    )
    context["chunk_count"] = document.chunks.count()
    return render(request, "knowledge/document.html", context)


@login_required
@require_POST
def document_label(request, slug, pk):
    """Tags and the enabled flag of the current version (a new version inherits them)."""
    workspace = _workspace(request, slug, Role.EDITOR)
    document = _document(workspace, pk)
    form = DocumentLabelForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(error for errors in form.errors.values() for error in errors))
    elif document.superseded_by_id is not None:
        messages.error(request, "Tags belong to the current version; change them there.")
    else:
        scopes.document_label(
            document=document, tags=form.cleaned_data["tags"], enabled=form.cleaned_data["enabled"], actor=request.user
        )
        messages.success(request, f"Saved the tags of “{document.title}”.")
    return redirect("knowledge:document", slug=workspace.slug, pk=document.pk)


@login_required
@require_POST
def document_replace(request, slug, pk):
    """Upload a new version of this document, whatever the new file is called."""
    workspace = _workspace(request, slug, Role.EDITOR)
    document = _document(workspace, pk)
    form = DocumentReplaceForm(request.POST, request.FILES)
    if not form.is_valid():
        messages.error(request, " ".join(error for errors in form.errors.values() for error in errors))
        return redirect("knowledge:document", slug=workspace.slug, pk=document.pk)
    uploaded = form.cleaned_data["file"]
    try:
        ratelimits.rate_limit_check(limit="RATE_LIMIT_UPLOAD", user=request.user)
        ingestion.check_upload_size(uploaded.name, uploaded.size)
    except (ratelimits.RateLimited, ingestion.DocumentRejected) as err:
        messages.error(request, str(err))
        return redirect("knowledge:document", slug=workspace.slug, pk=document.pk)
    result = _upload_one(request, workspace, filename=uploaded.name, data=uploaded.read(), replace=document)
    if result["level"] != "success":
        messages.error(request, result["message"])
        return redirect("knowledge:document", slug=workspace.slug, pk=document.pk)
    messages.success(request, result["message"])
    return redirect("knowledge:document", slug=workspace.slug, pk=result["document"]["id"])


@login_required
@require_POST
def document_version_prune(request, slug, pk):
    """Delete an older version from the history."""
    workspace = _workspace(request, slug, Role.EDITOR)
    document = _document(workspace, pk)
    current = document.superseded_by_id
    try:
        ingestion.version_prune(document=document, actor=request.user)
    except ingestion.VersionRefused as err:
        messages.error(request, str(err))
        return redirect("knowledge:document", slug=workspace.slug, pk=document.pk)
    messages.success(request, f"Deleted version {document.version} of “{document.title}”.")
    return redirect("knowledge:document", slug=workspace.slug, pk=current)


def _language_name(code: str) -> str:
    # Django knows the names of about a hundred languages; the detector names a few more.
    try:
        return get_language_info(code)["name"] if code else ""
    except KeyError:
        return code


def _sentence_span(request, chunk) -> tuple[int, int]:
    """The cited sentence (`start`/`end`, document offsets) clipped to its chunk; an empty span
    at the chunk's end when none is given or it lies outside."""
    try:
        start, end = int(request.GET["start"]), int(request.GET["end"])
    except (KeyError, ValueError):
        return chunk.char_end, chunk.char_end
    start, end = max(start, chunk.char_start), min(end, chunk.char_end)
    return (start, end) if start < end else (chunk.char_end, chunk.char_end)


def _document_parts(structure: parsing.ParsedDocument, chunk, sentence: tuple[int, int] | None) -> list[dict]:
    """The document's text as parts to print in order: text, an anchor where a page, slide, sheet
    or section starts (a citation can jump to it: "page-4", "section-3"), and the marks of what
    was cited: the sentence when one is given, else the chunk. Only text is marked, line by line:
    a mark across lines would box the blank lines and a PDF's line numbers too."""
    marks: dict[int, list[dict]] = {}
    for index, section in enumerate(structure.sections, 1):
        marks.setdefault(section.start, []).append({"anchor": f"section-{index}", "label": ""})
    for region in structure.regions:
        label = f"{region.kind} {region.name or region.number}"
        marks.setdefault(region.start, []).insert(0, {"anchor": f"{region.kind}-{region.number}", "label": label})
    if chunk is not None:
        kind, span = ("sentence", sentence) if sentence and sentence[0] < sentence[1] else ("chunk", None)
        span = span or (chunk.char_start, chunk.char_end)
        if kind == "sentence":
            # The chunk's own anchor stays, so a link to it lands on the passage.
            marks.setdefault(chunk.char_start, []).insert(0, {"anchor": f"chunk-{chunk.pk}", "label": ""})
        for number, (start, end) in enumerate(_text_runs(structure.text, *span)):
            marks.setdefault(start, []).append({"open": kind, "first": number == 0})
            marks.setdefault(end, []).insert(0, {"close": kind})
    cuts = sorted({0, len(structure.text), *marks})
    parts = []
    for start, end in zip(cuts, cuts[1:] + [None], strict=True):
        parts += sorted(marks.get(start, []), key=lambda mark: 0 if "close" in mark else 1)
        if end is not None and end > start:
            parts.append({"text": structure.text[start:end]})
    return parts


_LEADING_NUMBER = re.compile(r"[ \t]*(\d{1,5})[ \t]+(?=\S)")


def _text_runs(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The stretches of `text[start:end]` worth marking: each line's text without its surrounding
    blanks, and without a leading line number when the lines are numbered (most lines begin with
    a number and the numbers never go down, as in a PDF of a contract or a paper under review)."""
    lines, at = [], start
    for line in text[start:end].splitlines(keepends=True):
        lines.append((at, line))
        at += len(line)
    numbered = [(offset, _LEADING_NUMBER.match(line)) for offset, line in lines if line.strip()]
    numbers = [int(match.group(1)) for _, match in numbered if match]
    line_numbers = len(numbers) >= 3 and len(numbers) >= 0.8 * len(numbered) and numbers == sorted(numbers)
    runs = []
    for offset, line in lines:
        body = line.rstrip()
        skip = len(body) - len(body.lstrip())
        match = _LEADING_NUMBER.match(body) if line_numbers else None
        if match:
            skip = match.end()
        if skip < len(body):
            runs.append((offset + skip, offset + len(body)))
    return runs


@login_required
@require_POST
def document_retry(request, slug, pk):
    workspace = _workspace(request, slug, Role.EDITOR)
    document = _document(workspace, pk)
    if ingestion.document_retry(document=document):
        messages.success(request, f"“{document.title}” is queued again.")
    else:
        messages.error(
            request, f"“{document.title}” is being worked on; only failed or abandoned documents can be retried."
        )
    if request.htmx:
        document.refresh_from_db()
        return render(
            request, "knowledge/_document_row.html", _context(workspace, doc=events.document_payload(document))
        )
    return redirect("knowledge:documents", slug=workspace.slug)


@login_required
@require_http_methods(["GET", "POST"])
def document_delete(request, slug, pk):
    workspace = _workspace(request, slug, Role.EDITOR)
    document = _document(workspace, pk)
    if request.method == "POST":
        ingestion.document_delete(document=document, actor=request.user, rebuild_now=False)
        messages.success(request, f"Deleted “{document.title}” and what the graph learned only from it.")
        return redirect("knowledge:documents", slug=workspace.slug)
    return render(request, "knowledge/document_delete.html", _context(workspace, document=document))


@login_required
@require_POST
def documents_delete(request, slug):
    """Several documents at once (the list's checkboxes); the graph is rebuilt once for all of them."""
    workspace = _workspace(request, slug, Role.EDITOR)
    ids = [int(value) for value in request.POST.getlist("documents") if value.isdigit()]
    documents = list(workspace.documents.filter(pk__in=ids).defer("text"))
    if not documents:
        messages.error(request, "Choose the documents to delete first.")
    elif request.POST.get("confirm") != "yes":
        return render(request, "knowledge/documents_delete.html", _context(workspace, documents=documents))
    else:
        count = ingestion.documents_delete(documents=documents, actor=request.user, rebuild_now=False)
        messages.success(
            request, f"Deleted {count} document{'s' if count != 1 else ''} and what the graph learned only from them."
        )
    return redirect("knowledge:documents", slug=workspace.slug)


@login_required
@require_GET
def entities(request, slug):
    workspace = _workspace(request, slug)
    query, type_, order = (request.GET.get(name, "").strip() for name in ("q", "type", "order"))
    rows = selectors.entities_browse(workspace=workspace, query=query, type=type_, order=order or "degree")
    page = Paginator(rows, ENTITIES_PER_PAGE).get_page(request.GET.get("page"))
    context = _context(
        workspace,
        page=page,
        query=query,
        type=type_,
        order=order or "degree",
        type_counts=selectors.entity_type_counts(workspace=workspace),
    )
    template = "knowledge/_entity_table.html" if request.htmx else "knowledge/entities.html"
    return render(request, template, context)


@login_required
@require_GET
def entity(request, slug, pk):
    workspace = _workspace(request, slug)
    entity = get_object_or_404(workspace.entities.published().defer("embedding"), pk=pk)
    context = _context(
        workspace,
        entity=entity,
        relations=selectors.relations_of_entity(entity=entity),
        provenance=selectors.entity_provenance(entity=entity),
        aliases=entity.aliases.order_by("name"),
    )
    # The graph view shows an entity in its side panel without leaving the page.
    template = "knowledge/_entity_panel.html" if request.htmx else "knowledge/entity.html"
    return render(request, template, context)


def _graph_limit(request) -> int:
    try:
        limit = int(request.GET.get("limit", GRAPH_DEFAULT_NODES))
    except ValueError:
        return GRAPH_DEFAULT_NODES
    return max(1, min(limit, GRAPH_MAX_NODES))


@login_required
@require_GET
def graph(request, slug):
    workspace = _workspace(request, slug)
    context = _context(
        workspace, limit=_graph_limit(request), max_nodes=GRAPH_MAX_NODES, export_formats=export.FORMATS.values()
    )
    return render(request, "knowledge/graph.html", context)


@login_required
@require_GET
def graph_export(request, slug, format):  # noqa: A002 - the URL's name for it
    workspace = _workspace(request, slug)
    chosen = export.FORMATS.get(format)
    if chosen is None:
        raise Http404("No such export format.")
    blocks = chosen.write(workspace)
    # Under daphne the blocks are read on a thread of their own, so the download streams;
    # a WSGI server (and the test client) iterates them in the request's thread.
    content = export.on_own_thread(blocks) if isinstance(request, ASGIRequest) else blocks
    response = StreamingHttpResponse(content, content_type=chosen.content_type)
    response["Content-Disposition"] = f'attachment; filename="{export.export_filename(workspace, chosen)}"'
    return response


@login_required
@require_GET
def graph_json(request, slug):
    workspace = _workspace(request, slug)
    return JsonResponse(selectors.graph_top(workspace=workspace, limit=_graph_limit(request)))


@login_required
@require_GET
def members(request, slug):
    workspace = _workspace(request, slug, Role.OWNER)
    return _members_page(request, workspace)


def _members_page(request, workspace, form=None, invite_form=None, status=200) -> HttpResponse:
    memberships = workspace.memberships.select_related("user").order_by("user__username")
    pending = [
        {
            "invitation": invitation,
            "link": invitations.invitation_link(invitation, base_url=request.build_absolute_uri("/")),
            "expired": invitation.expires_at <= timezone.now(),
        }
        for invitation in invitations.invitations_pending(workspace=workspace)
    ]
    context = _context(
        workspace,
        form=form or MemberAddForm(),
        invite_form=invite_form or InviteForm(),
        memberships=memberships,
        roles=Role.choices,
        pending=pending,
        invitation_days=settings.INVITATION_DAYS,
        shown_link=request.session.pop("invitation_link_shown", None),
    )
    return render(request, "knowledge/members.html", context, status=status)


def _invitation_sent(request, invitation) -> None:
    """Say how the invitation went out; the link is shown either way, for teams without mail."""
    if invitation.send_error:
        messages.error(
            request,
            f"The invitation of {invitation.email} is ready, but the email failed: {invitation.send_error}. "
            "Copy its link below and send it yourself.",
        )
    else:
        messages.success(request, f"Invitation emailed to {invitation.email}; its link is below too.")
    request.session["invitation_link_shown"] = invitation.pk


@login_required
@require_POST
def invitation_create(request, slug):
    workspace = _workspace(request, slug, Role.OWNER)
    form = InviteForm(request.POST)
    if form.is_valid():
        try:
            invitation = invitations.invitation_create(
                workspace=workspace, actor=request.user, base_url=request.build_absolute_uri("/"), **form.cleaned_data
            )
        except invitations.InvitationError as err:
            form.add_error("email", str(err))
        except ratelimits.RateLimited as limited:
            form.add_error(None, str(limited))
        else:
            _invitation_sent(request, invitation)
            return redirect("knowledge:members", slug=workspace.slug)
    return _members_page(request, workspace, invite_form=form, status=400)


def _pending_invitation(workspace, pk):
    return get_object_or_404(workspace.invitations.select_related("workspace", "invited_by"), pk=pk)


@login_required
@require_POST
def invitation_resend(request, slug, pk):
    workspace = _workspace(request, slug, Role.OWNER)
    try:
        invitation = invitations.invitation_resend(
            invitation=_pending_invitation(workspace, pk), actor=request.user, base_url=request.build_absolute_uri("/")
        )
    except (invitations.InvitationError, ratelimits.RateLimited) as err:
        messages.error(request, str(err))
    else:
        _invitation_sent(request, invitation)
    return redirect("knowledge:members", slug=workspace.slug)


@login_required
@require_POST
def invitation_revoke(request, slug, pk):
    workspace = _workspace(request, slug, Role.OWNER)
    invitation = _pending_invitation(workspace, pk)
    try:
        invitations.invitation_revoke(invitation=invitation, actor=request.user)
    except invitations.InvitationError as err:
        messages.error(request, str(err))
    else:
        messages.success(request, f"Withdrew the invitation of {invitation.email}; its link no longer works.")
    return redirect("knowledge:members", slug=workspace.slug)


@login_required
@require_POST
def member_add(request, slug):
    workspace = _workspace(request, slug, Role.OWNER)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            membership = workspaces.membership_add(workspace=workspace, actor=request.user, **form.cleaned_data)
        except workspaces.MembershipError as err:
            form.add_error("identifier", str(err))
        else:
            messages.success(request, f"Added {membership.user.get_username()} as {membership.role}.")
            return redirect("knowledge:members", slug=workspace.slug)
    return _members_page(request, workspace, form=form, status=400)


def _membership(workspace, pk) -> Membership:
    return get_object_or_404(workspace.memberships.select_related("user"), pk=pk)


@login_required
@require_POST
def member_role(request, slug, pk):
    workspace = _workspace(request, slug, Role.OWNER)
    membership = _membership(workspace, pk)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose viewer, editor or owner.")
    else:
        try:
            membership = workspaces.membership_set_role(
                membership=membership, actor=request.user, role=form.cleaned_data["role"]
            )
        except workspaces.MembershipError as err:
            messages.error(request, str(err))
        else:
            messages.success(request, f"{membership.user.get_username()} is now {membership.role}.")
    return redirect("knowledge:members", slug=workspace.slug)


@login_required
@require_POST
def member_remove(request, slug, pk):
    """Owners remove anyone; every member may remove themselves (leave)."""
    workspace = _workspace(request, slug)
    membership = _membership(workspace, pk)
    leaving = membership.user_id == request.user.pk
    if not leaving and not _can(workspace, Role.OWNER):
        raise PermissionDenied("Only owners can remove other members.")
    try:
        workspaces.membership_remove(membership=membership, actor=request.user)
    except workspaces.MembershipError as err:
        messages.error(request, str(err))
        return redirect("knowledge:members" if _can(workspace, Role.OWNER) else "knowledge:workspace", slug=slug)
    if leaving:
        messages.success(request, f"You left {workspace.name}.")
        return redirect("home")
    messages.success(request, f"Removed {membership.user.get_username()}.")
    return redirect("knowledge:members", slug=workspace.slug)


@login_required
@require_http_methods(["GET", "POST"])
def workspace_settings(request, slug):
    workspace = _workspace(request, slug, Role.OWNER)
    form = WorkspaceSettingsForm(_posted(request), instance=Workspace.objects.get(pk=workspace.pk))
    if request.method == "POST" and form.is_valid():
        workspaces.workspace_update(workspace=workspace, actor=request.user, **form.cleaned_data)
        messages.success(request, "Settings saved. They apply to documents ingested from now on.")
        return redirect("knowledge:settings", slug=workspace.slug)
    status = 400 if form.errors else 200
    return render(request, "knowledge/settings.html", _context(workspace, form=form), status=status)


@login_required
@require_http_methods(["GET", "POST"])
def workspace_delete(request, slug):
    workspace = _workspace(request, slug, Role.OWNER)
    if request.method == "POST":
        if request.POST.get("confirm_name", "").strip() != workspace.name:
            messages.error(request, "Type the workspace's name exactly to delete it.")
            return redirect("knowledge:workspace_delete", slug=workspace.slug)
        workspaces.workspace_delete(workspace=workspace, actor=request.user)
        messages.success(request, f"Deleted the workspace {workspace.name}.")
        return redirect("home")
    context = _context(workspace, document_total=workspace.documents.count())
    return render(request, "knowledge/workspace_delete.html", context)


@login_required
@require_GET
def audit(request, slug):
    workspace = _workspace(request, slug, Role.OWNER)
    events = workspace.audit_events.select_related("actor")
    page = Paginator(events, 100).get_page(request.GET.get("page"))
    return render(request, "knowledge/audit.html", _context(workspace, page=page))


def login_locked_out(request, original_response=None, credentials=None):
    """django-axes' answer to a locked-out login (settings.AXES_LOCKOUT_CALLABLE): the page in
    the site's layout, a 429, and Retry-After, since every failure restarts the pause."""
    from axes.helpers import get_client_username, get_cool_off

    cool_off = get_cool_off(request)
    context = {
        "failure_limit": settings.LOGIN_FAILURE_LIMIT,
        "username": get_client_username(request, credentials) or "",
        "cooloff_timedelta": cool_off,
    }
    response = render(request, "registration/locked_out.html", context, status=429)
    response["Retry-After"] = str(int(cool_off.total_seconds()))
    return response


def healthz(request):
    """For the container healthcheck (scripts/healthcheck.py): the app answers and reaches its database."""
    from django.db import connection

    connection.ensure_connection()
    return HttpResponse("ok", content_type="text/plain")
