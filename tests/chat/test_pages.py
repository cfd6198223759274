import json
import re

import pytest
from django.urls import reverse

from chat.models import ChatPreferences, Conversation, Message
from knowledge.models import Document, Entity, Role
from knowledge.services import ingestion
from tests.chat.conftest import build_handbook
from tests.factories import make_document, make_entity, make_user, make_workspace

XSS_DOCUMENT = (
    "Intro. <script>alert('doc')</script> <img src=x onerror=alert(1)> "
    "[click](javascript:alert(1)) Ada Lovelace wrote the first algorithm."
)


@pytest.fixture
def team(db, owner):
    viewer, outsider = make_user("viewer"), make_user("outsider")
    workspace = make_workspace(slug="acme", members={owner: Role.OWNER, viewer: Role.VIEWER})
    return workspace, viewer, outsider


def conversation_with_answer(workspace, user, *, content="Ada wrote it [S1].", shared=False, citations=None):
    conversation = Conversation.objects.create(workspace=workspace, user=user, title="About Ada", shared=shared)
    Message.objects.create(conversation=conversation, role="user", content="Who wrote it?", mode="mix")
    Message.objects.create(
        conversation=conversation,
        role="assistant",
        content=content,
        mode="mix",
        extractive=True,
        subgraph={"nodes": [{"id": "1", "label": "Ada Lovelace", "type": "person", "row": "E1"}], "edges": []},
        citations=citations
        or [{"id": "S1", "kind": "source", "document_title": "Handbook", "excerpt": "Ada wrote it", "chunk_id": 1}],
        keywords={"low_level": ["Ada"], "high_level": []},
    )
    return conversation


def page_sources(response) -> dict:
    """The data of the sources panel's answer, as the graph panel reads it."""
    html = response.content.decode()
    start = html.index('<script id="sources-data" type="application/json">') + len(
        '<script id="sources-data" type="application/json">'
    )
    return json.loads(html[start : html.index("</script>", start)])


def test_it_sends_anonymous_visitors_to_log_in(client, team):
    response = client.get(reverse("chat:new", args=["acme"]))

    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_it_hides_the_chat_of_a_workspace_from_non_members(client, team):
    workspace, viewer, outsider = team
    client.force_login(outsider)

    assert client.get(reverse("chat:new", args=["acme"])).status_code == 404
    assert client.get(reverse("chat:conversations", args=["acme"])).status_code == 404


def test_it_shows_a_viewer_the_chat_page_with_every_mode_explained(client, team):
    workspace, viewer, _ = team
    client.force_login(viewer)

    response = client.get(reverse("chat:new", args=["acme"]))

    assert response.status_code == 200
    html = response.content.decode()
    for mode in ("mix", "hybrid", "local", "global", "naive", "bypass"):
        assert f'<option value="{mode}"' in html
    assert "plus a direct search of the passages" in html
    assert "/ws/workspaces/acme/chat/" in html
    assert "vendor/cytoscape.min.js" in html
    # Every script and style is served by the app (no CDN). Asserting that "cdn" is absent from
    # the page failed when the random CSRF token happened to contain those letters.
    assert not re.search(r"""(?:src|href)=["'](?:https?:)?//""", html)


def test_it_labels_answers_extractive_when_no_chat_model_is_configured(client, team, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    workspace, viewer, _ = team
    client.force_login(viewer)

    response = client.get(reverse("chat:new", args=["acme"]))

    assert b"<strong>Extractive answers</strong>" in response.content


def test_it_reloads_a_conversation_with_every_answer_its_graph_and_citations(client, team):
    workspace, viewer, _ = team
    conversation = conversation_with_answer(workspace, viewer)
    client.force_login(viewer)

    response = client.get(reverse("chat:conversation", args=["acme", conversation.pk]))

    html = response.content.decode()
    assert "Who wrote it?" in html
    assert 'Ada wrote it <a href="#cite-S1" class="cite" data-cite="S1"' in html
    assert "<strong>Extractive answers</strong>" in html
    answer = page_sources(response)
    assert answer["answer"] == conversation.messages.get(role="assistant").pk
    assert answer["subgraph"]["nodes"][0]["label"] == "Ada Lovelace"
    assert answer["citations"][0]["id"] == "S1"
    assert answer["cited"] == ["S1"]
    assert '<li class="cited-item kind-source" id="cite-S1" data-cite="S1">' in html


def test_it_renders_markup_in_saved_answers_and_citations_inert(client, team):
    workspace, viewer, _ = team
    conversation = conversation_with_answer(
        workspace,
        viewer,
        content="<script>alert(1)</script> <img src=x onerror=alert(1)> [x](javascript:alert(1))",
        citations=[
            {"id": "S1", "kind": "source", "document_title": "<b>T</b>", "excerpt": "</script><script>alert(2)"}
        ],
    )
    client.force_login(viewer)

    response = client.get(reverse("chat:conversation", args=["acme", conversation.pk]))

    html = response.content.decode()
    body = html[html.index('<div id="messages"') : html.index('<form id="ask-form"')]
    assert "<script" not in body
    assert "<img" not in body
    assert "javascript:" not in body.replace("[x](javascript:alert(1))", "")
    # json_script escapes <, > and &, so an excerpt cannot close the data block.
    assert "alert(2)" in html
    assert "</script><script>alert(2)" not in html
    assert page_sources(response)["citations"][0]["excerpt"] == "</script><script>alert(2)"


def test_it_keeps_private_conversations_private(client, team, owner):
    workspace, viewer, _ = team
    private = conversation_with_answer(workspace, owner)
    client.force_login(viewer)

    assert client.get(reverse("chat:conversation", args=["acme", private.pk])).status_code == 404
    assert b"About Ada" not in client.get(reverse("chat:conversations", args=["acme"])).content


def test_it_lets_members_read_a_shared_conversation_but_not_change_it(client, team, owner):
    workspace, viewer, _ = team
    shared = conversation_with_answer(workspace, owner, shared=True)
    client.force_login(viewer)

    page = client.get(reverse("chat:conversation", args=["acme", shared.pk]))
    listing = client.get(reverse("chat:conversations", args=["acme"]))

    assert page.status_code == 200
    assert b"shared by owner" in page.content
    assert reverse("chat:rename", args=["acme", shared.pk]).encode() not in page.content
    assert b"About Ada" in listing.content
    for action in ("rename", "share", "delete"):
        response = client.post(reverse(f"chat:{action}", args=["acme", shared.pk]), {"title": "Mine now"})
        assert response.status_code == 404
    shared.refresh_from_db()
    assert (shared.title, shared.shared) == ("About Ada", True)


def test_it_lets_the_owner_rename_share_and_delete_a_conversation(client, team):
    workspace, viewer, _ = team
    conversation = conversation_with_answer(workspace, viewer)
    client.force_login(viewer)

    renamed = client.post(
        reverse("chat:rename", args=["acme", conversation.pk]), {"title": "  Lovelace notes "}, HTTP_HX_REQUEST="true"
    )
    shared = client.post(reverse("chat:share", args=["acme", conversation.pk]), {"shared": "on"})

    assert renamed.status_code == 200
    assert b"Lovelace notes" in renamed.content
    assert f'id="conversation-{conversation.pk}"'.encode() in renamed.content
    assert shared.status_code == 302
    conversation.refresh_from_db()
    assert (conversation.title, conversation.shared) == ("Lovelace notes", True)
    client.post(reverse("chat:share", args=["acme", conversation.pk]), {})
    conversation.refresh_from_db()
    assert conversation.shared is False

    deleted = client.post(reverse("chat:delete", args=["acme", conversation.pk]), HTTP_HX_REQUEST="true")

    assert deleted.status_code == 200
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()


def test_it_sends_the_header_partial_when_renamed_from_the_chat_page(client, team):
    workspace, viewer, _ = team
    conversation = conversation_with_answer(workspace, viewer)
    client.force_login(viewer)

    response = client.post(
        reverse("chat:rename", args=["acme", conversation.pk]),
        {"title": "New name"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="conversation-header",
    )
    deleted = client.post(
        reverse("chat:delete", args=["acme", conversation.pk]),
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="conversation-header",
    )

    assert b"<h1" in response.content
    assert b"New name" in response.content
    assert deleted["HX-Redirect"] == reverse("chat:new", args=["acme"])


def test_it_ignores_a_blank_new_title(client, team):
    workspace, viewer, _ = team
    conversation = conversation_with_answer(workspace, viewer)
    client.force_login(viewer)

    client.post(reverse("chat:rename", args=["acme", conversation.pk]), {"title": "   "})

    conversation.refresh_from_db()
    assert conversation.title == "About Ada"


def test_it_serves_an_entitys_neighbours_to_members_only(client, team):
    workspace, viewer, outsider = team
    _, _, (ada, babbage, engine), _ = build_handbook(workspace)
    elsewhere = make_entity(make_workspace(slug="other"), "Hidden")
    url = reverse("chat:neighbours", args=["acme"])
    client.force_login(viewer)

    response = client.get(url, {"entity": babbage.pk})

    assert response.status_code == 200
    graph = response.json()
    assert {node["label"] for node in graph["nodes"]} == {"Ada Lovelace", "Charles Babbage", "Analytical Engine"}
    assert graph["nodes"][0]["id"] == str(babbage.pk)
    assert graph["nodes"][0]["degree"] == 2
    assert graph["nodes"][0]["description"].startswith("Designed")
    assert [edge["weight"] for edge in graph["edges"]] == [2.0, 1.0]
    assert {edge["source"] for edge in graph["edges"]} | {edge["target"] for edge in graph["edges"]} == {
        str(ada.pk),
        str(babbage.pk),
        str(engine.pk),
    }
    assert client.get(url, {"entity": elsewhere.pk}).status_code == 404
    assert client.get(url, {"entity": "nope"}).status_code == 404
    client.force_login(outsider)
    assert client.get(url, {"entity": babbage.pk}).status_code == 404


def test_the_neighbours_panel_shows_nothing_of_a_document_still_being_ingested(client, team):
    workspace, viewer, _ = team
    _, _, (_, babbage, _), _ = build_handbook(workspace)
    memo = b"Charles Babbage corresponded with Mary Somerville. Mary Somerville introduced Ada to Charles Babbage."
    document = ingestion.document_create(workspace=workspace, filename="memo.txt", data=memo, enqueue=False)
    url = reverse("chat:neighbours", args=["acme"])
    client.force_login(viewer)
    mid_ingest = []

    def read_the_panel(document):
        # Built, not yet published: the memo's rows exist, and nothing of them may show.
        if document.stage == Document.Stage.PUBLISHING:
            mid_ingest.append(client.get(url, {"entity": babbage.pk}).json())

    ingestion.document_ingest(document_id=document.pk, progress=read_the_panel)

    assert len(mid_ingest) == 1
    assert Entity.objects.filter(workspace=workspace, name="Mary Somerville").exists()
    assert {node["label"] for node in mid_ingest[0]["nodes"]} == {
        "Ada Lovelace",
        "Charles Babbage",
        "Analytical Engine",
    }
    published = client.get(url, {"entity": babbage.pk}).json()
    assert "Mary Somerville" in {node["label"] for node in published["nodes"]}


def test_it_shows_a_cited_chunk_with_document_markup_inert(client, team):
    workspace, viewer, _ = team
    document, chunk, _, _ = build_handbook(workspace, text=XSS_DOCUMENT, title="<i>Tricky</i>")
    client.force_login(viewer)

    response = client.get(reverse("knowledge:document", args=["acme", document.pk]), {"chunk": chunk.pk})

    html = response.content.decode()
    assert response.status_code == 200
    assert "&lt;script&gt;alert(&#x27;doc&#x27;)&lt;/script&gt;" in html
    assert "<img src=x" not in html
    assert "<i>Tricky</i>" not in html
    assert f'id="chunk-{chunk.pk}"' in html


def test_it_remembers_a_members_chat_settings_and_refuses_bad_ones(client, team, settings):
    workspace, viewer, outsider = team
    client.force_login(viewer)
    url = reverse("chat:preferences", args=["acme"])

    response = client.post(url, {"mode": "local", "top_k": "12", "chunk_top_k": "5", "response_type": "Bullet Points"})

    assert response.status_code == 204
    page = client.get(reverse("chat:new", args=["acme"])).content.decode()
    assert re.search(r'<option value="local"[^>]*selected>', page)
    assert 'name="top_k" min="1" max="200" value="12"' in page
    assert client.post(url, {"top_k": "0"}).json() == {"error": "top_k must be between 1 and 200."}
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    refused = client.post(url, {"mode": "bypass"})
    assert refused.status_code == 400
    assert "Needs a chat model" in refused.json()["error"]
    client.force_login(outsider)
    assert client.post(url, {"mode": "local"}).status_code == 404


def test_it_lists_an_answers_cited_sources_with_their_sentence_links(client, team):
    workspace, viewer, _ = team
    citations = [
        {"id": "S1", "kind": "source", "document_title": "Handbook", "document_id": 7, "chunk_id": 3,
         "section": "Handbook > Engines", "location": "p. 4", "sentence_start": 120, "sentence_end": 180},
        {"id": "E1", "kind": "entity", "label": "Ada Lovelace", "document_title": "Handbook", "document_id": 7,
         "chunk_id": 3},
        {"id": "S2", "kind": "source", "document_title": "Notes", "document_id": 8, "chunk_id": 4},
    ]  # fmt: skip
    conversation = conversation_with_answer(workspace, viewer, content="Ada [E1] wrote it [S1].", citations=citations)
    client.force_login(viewer)

    html = client.get(reverse("chat:conversation", args=["acme", conversation.pk])).content.decode()

    footer = html[html.index('<footer class="answer-sources">') : html.index("</footer>")]
    assert footer.index("S1") < footer.index("E1")  # sources first
    assert "Notes" not in footer  # retrieved, not cited
    assert "/workspaces/acme/documents/7/?chunk=3&amp;start=120&amp;end=180#chunk-3" in footer
    assert "Handbook &gt; Engines · p. 4" in footer


def test_it_shows_the_extractive_notice_once_on_the_page_and_not_in_every_answer(client, team, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    workspace, viewer, _ = team
    conversation = conversation_with_answer(workspace, viewer)
    client.force_login(viewer)

    html = client.get(reverse("chat:conversation", args=["acme", conversation.pk])).content.decode()

    assert html.count('id="extractive-notice"') == 1
    assert "extractive answer</span>" not in html


def test_it_shows_only_the_settings_that_change_something_in_the_mode(client, team, settings):
    workspace, viewer, _ = team
    client.force_login(viewer)
    url = reverse("chat:preferences", args=["acme"])
    htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "ask-settings"}
    settings.LLM_BASE_URL, settings.LLM_API_KEY = "http://127.0.0.1:9/v1", "a-key"
    client.post(url, {"mode": "mix", "top_k": "12", "response_type": "Bullet Points"})

    with_model = client.get(reverse("chat:new", args=["acme"])).content.decode()
    naive = client.post(url, {"mode": "naive", "response_type": "Bullet Points", "chunk_top_k": "5"}, **htmx)
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    extractive = client.get(reverse("chat:new", args=["acme"])).content.decode()

    assert 'id="ask-response-type"' in with_model
    assert 'id="ask-top-k"' in with_model
    assert naive.status_code == 200
    partial = naive.content.decode()
    assert partial.startswith("<fieldset") or partial.lstrip().startswith("<fieldset")
    assert 'id="ask-top-k"' not in partial
    assert "Graph rows: Naive reads no graph." in partial
    assert 'id="ask-chunk-top-k"' in partial
    assert "Settings saved" in partial
    assert "HX-Reswap" not in naive.headers  # a new mode: the settings are redrawn
    same_mode = client.post(url, {"mode": "naive", "chunk_top_k": "5"}, **htmx)
    assert same_mode.headers["HX-Reswap"] == "none"  # only the status line changes
    assert 'id="ask-response-type"' not in extractive
    assert "Answer as: only a chat model writes in a form" in extractive
    # A setting left off the page keeps its saved value for the modes that use it.
    preferences = ChatPreferences.objects.get(user=viewer)
    assert (preferences.mode, preferences.top_k, preferences.chunk_top_k) == ("naive", 12, 5)


def test_it_redraws_the_settings_with_the_reason_when_a_change_is_refused(client, team, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    workspace, viewer, _ = team
    client.force_login(viewer)

    response = client.post(reverse("chat:preferences", args=["acme"]), {"mode": "bypass"}, HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    assert "Needs a chat model" in response.content.decode()
    assert 'role="alert"' in response.content.decode()
    assert not ChatPreferences.objects.filter(user=viewer).exists()


def test_it_shows_the_sources_of_an_answer_the_reader_may_read(client, team, owner):
    workspace, viewer, outsider = team
    mine = conversation_with_answer(workspace, viewer).messages.get(role="assistant")
    private = conversation_with_answer(workspace, owner).messages.get(role="assistant")
    client.force_login(viewer)

    response = client.get(reverse("chat:sources", args=["acme", mine.pk]))

    assert response.status_code == 200
    assert response.content.decode().lstrip().startswith('<section id="sources"')
    assert page_sources(response)["answer"] == mine.pk
    assert client.get(reverse("chat:sources", args=["acme", private.pk])).status_code == 404
    client.force_login(outsider)
    assert client.get(reverse("chat:sources", args=["acme", mine.pk])).status_code == 404


def test_the_scope_picker_offers_tags_and_documents_and_shows_the_conversations_scope(client, team):
    workspace, viewer, _ = team
    handbook = make_document(workspace, title="Handbook")
    Document.objects.filter(pk=handbook.pk).update(tags=["policies", "people"])
    make_document(workspace, title="Minutes")
    conversation = conversation_with_answer(workspace, viewer)
    Conversation.objects.filter(pk=conversation.pk).update(scope={"tags": ["people"], "documents": [handbook.pk]})
    client.force_login(viewer)

    fresh = client.get(reverse("chat:new", args=[workspace.slug])).content.decode()
    page = client.get(reverse("chat:conversation", args=[workspace.slug, conversation.pk])).content.decode()

    assert 'Scope: <span id="scope-summary">all documents</span>' in fresh
    assert re.findall(r'name="scope_tag" value="(\w+)"( checked)?', page) == [("people", " checked"), ("policies", "")]
    assert f'name="scope_document" value="{handbook.pk}" checked' in page
    assert "Minutes" in page


def test_it_shows_each_keyword_once_under_its_level(client, team):
    workspace, viewer, _ = team
    conversation = conversation_with_answer(workspace, viewer)
    Message.objects.filter(conversation=conversation, role="assistant").update(
        keywords={"low_level": ["Ada Lovelace", "Analytical Engine"], "high_level": ["analytical engine", "computing"]}
    )
    client.force_login(viewer)

    html = client.get(reverse("chat:conversation", args=["acme", conversation.pk])).content.decode()

    shown = re.sub(r"<[^>]+>", "", re.search(r'<span id="keywords".*?</span></span>', html, re.S).group(0))
    assert shown == "names: Ada Lovelace, Analytical Engine · themes: computing"
