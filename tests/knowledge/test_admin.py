import numpy as np
import pytest
from django.urls import reverse

from knowledge.models import AuditEvent, Entity, EntityAlias, EntitySource, MergeLog, Role
from tests.factories import (
    make_chunk,
    make_document,
    make_entity,
    make_relation,
    make_user,
    make_workspace,
    random_vector,
)


@pytest.fixture
def curation(db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    rng = np.random.default_rng(3)
    editor = make_user("editor", is_staff=True)
    viewer = make_user("viewer", is_staff=True)
    mine = make_workspace(slug="mine", name="Mine", members={editor: Role.EDITOR, viewer: Role.VIEWER})
    theirs = make_workspace(slug="theirs", name="Theirs Secret")
    document = make_document(mine, title="Report")
    chunks = [make_chunk(document, order=order, text=f"chunk {order}") for order in range(3)]
    acme = make_entity(mine, "Acme Corporation", embedding=random_vector(rng))
    typo = make_entity(mine, "Acme Corporatoin", embedding=random_vector(rng))
    berlin = make_entity(mine, "Berlin", type="location", embedding=random_vector(rng))
    for entity, chunk in [(acme, chunks[0]), (typo, chunks[1]), (berlin, chunks[2])]:
        EntitySource.objects.create(entity=entity, chunk=chunk, name=entity.name, description=f"About {entity.name}.")
    relation = make_relation(typo, berlin, weight=2, description="Based in Berlin.")
    relation.sources.create(chunk=chunks[1], description="Based in Berlin.", strength=2)
    hidden = make_entity(theirs, "Hidden Entity")
    return {
        "editor": editor,
        "viewer": viewer,
        "mine": mine,
        "theirs": theirs,
        "acme": acme,
        "typo": typo,
        "berlin": berlin,
        "hidden": hidden,
    }


@pytest.fixture
def editor_client(client, curation):
    client.force_login(curation["editor"])
    return client


def test_it_shows_a_staff_editor_only_their_workspaces_entities(editor_client, curation):
    response = editor_client.get(reverse("admin:knowledge_entity_changelist"))

    page = response.content.decode()
    assert response.status_code == 200
    assert "Acme Corporation" in page
    assert "Hidden Entity" not in page
    assert "Theirs Secret" not in page  # not even in the workspace filter


def test_it_answers_404_for_an_entity_of_another_workspace(editor_client, curation):
    response = editor_client.get(reverse("admin:knowledge_entity_change", args=[curation["hidden"].pk]))

    assert response.status_code in (302, 404)
    assert "Hidden Entity" not in response.content.decode()


def test_it_keeps_staff_viewers_and_non_staff_editors_out(client, curation):
    client.force_login(curation["viewer"])
    assert client.get(reverse("admin:knowledge_entity_changelist")).status_code == 403

    outsider = make_user("plain-editor")
    curation["mine"].memberships.create(user=outsider, role=Role.EDITOR)
    client.force_login(outsider)
    response = client.get(reverse("admin:knowledge_entity_changelist"))
    assert response.status_code == 302
    assert reverse("admin:login") in response.url


def test_it_shows_superusers_every_workspace(client, curation):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))

    page = client.get(reverse("admin:knowledge_entity_changelist")).content.decode()

    assert "Hidden Entity" in page
    assert "Acme Corporation" in page


def test_it_shows_provenance_and_relations_on_the_entity_page(editor_client, curation):
    page = editor_client.get(reverse("admin:knowledge_entity_change", args=[curation["typo"].pk])).content.decode()

    assert "About Acme Corporatoin." in page
    assert "Based in Berlin." in page
    assert reverse("knowledge:document", args=["mine", curation["typo"].sources.get().chunk.document_id]) in page


def test_it_merges_through_the_action_and_undoes_from_the_merge_log(editor_client, curation):
    ids = [curation["acme"].pk, curation["typo"].pk]
    confirm = editor_client.post(
        reverse("admin:knowledge_entity_changelist"), {"action": "merge_into", "_selected_action": ids}
    )
    assert confirm.status_code == 200
    assert "Choose the entity that survives" in confirm.content.decode()

    merged = editor_client.post(
        reverse("admin:knowledge_entity_merge"),
        {"_selected_action": ids, "survivor": curation["acme"].pk, "apply": "1"},
        follow=True,
    )

    assert "Merged Acme Corporatoin into Acme Corporation" in merged.content.decode()
    assert not Entity.objects.filter(pk=curation["typo"].pk).exists()
    assert EntityAlias.objects.get(key="acme corporatoin").entity_id == curation["acme"].pk
    log = MergeLog.objects.get()
    assert log.user == curation["editor"]

    editor_client.post(reverse("admin:knowledge_mergelog_undo", args=[log.pk]))

    assert Entity.objects.filter(pk=curation["typo"].pk).exists()
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["entity.unmerge", "entity.merge"]


def test_it_refuses_to_merge_entities_of_a_workspace_the_user_cannot_curate(editor_client, curation):
    editor_client.post(
        reverse("admin:knowledge_entity_merge"),
        {
            "_selected_action": [curation["acme"].pk, curation["hidden"].pk],
            "survivor": curation["acme"].pk,
            "apply": "1",
        },
    )

    assert Entity.objects.filter(pk=curation["hidden"].pk).exists()
    assert not MergeLog.objects.exists()


def test_editing_an_entity_re_embeds_it(editor_client, curation):
    berlin = curation["berlin"]
    before = np.asarray(berlin.embedding).tolist()

    response = editor_client.post(
        reverse("admin:knowledge_entity_change", args=[berlin.pk]),
        {
            "name": "Berlin",
            "type": "city",
            "description": "Capital of Germany.",
            "sources-TOTAL_FORMS": "1",
            "sources-INITIAL_FORMS": "1",
            "sources-MIN_NUM_FORMS": "0",
            "sources-MAX_NUM_FORMS": "1000",
            "sources-0-id": berlin.sources.get().pk,
            "sources-0-entity": berlin.pk,
        },
    )

    assert response.status_code == 302
    berlin.refresh_from_db()
    assert (berlin.type, berlin.description) == ("city", "Capital of Germany.")
    assert np.asarray(berlin.embedding).tolist() != before
    assert AuditEvent.objects.get(action="entity.update").actor == curation["editor"]


def test_renaming_onto_another_entity_is_refused_with_a_message(editor_client, curation):
    response = editor_client.post(
        reverse("admin:knowledge_entity_change", args=[curation["typo"].pk]),
        {
            "name": "acme corporation",
            "type": "concept",
            "description": "",
            "sources-TOTAL_FORMS": "0",
            "sources-INITIAL_FORMS": "0",
            "sources-MIN_NUM_FORMS": "0",
            "sources-MAX_NUM_FORMS": "1000",
        },
    )

    assert response.status_code == 200
    assert "already exists in this workspace; merge the two instead" in response.content.decode()


def test_the_duplicates_page_lists_pairs_and_merges_in_one_click(editor_client, curation):
    mine = curation["mine"]
    page = editor_client.get(reverse("admin:knowledge_entity_duplicates"), {"workspace": mine.pk, "name": "0.9"})
    assert page.status_code == 200
    assert [{pair.first.name, pair.second.name} for pair in page.context["pairs"]] == [
        {"Acme Corporation", "Acme Corporatoin"}
    ]

    response = editor_client.post(
        reverse("admin:knowledge_entity_merge"),
        {
            "_selected_action": [curation["acme"].pk, curation["typo"].pk],
            "survivor": curation["typo"].pk,
            "apply": "1",
            "duplicates": "1",
            "workspace": mine.pk,
            "name": "0.9",
            "cosine": "0.92",
        },
    )

    assert response.url.startswith(reverse("admin:knowledge_entity_duplicates"))
    assert not Entity.objects.filter(pk=curation["acme"].pk).exists()


def test_the_duplicates_page_ignores_a_workspace_the_user_cannot_curate(editor_client, curation):
    response = editor_client.get(reverse("admin:knowledge_entity_duplicates"), {"workspace": curation["theirs"].pk})

    assert response.context["workspace"] == curation["mine"]
    assert "Theirs Secret" not in response.content.decode()


def test_it_lets_nobody_add_or_delete_graph_rows_in_the_admin(client, curation):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))

    assert client.get(reverse("admin:knowledge_entity_add")).status_code == 403
    assert client.get(reverse("admin:knowledge_entity_delete", args=[curation["acme"].pk])).status_code == 403


# --- Documents: deleting goes through the deletion service; what a run owns is not editable ----


@pytest.fixture
def two_graphs(db, settings, openai_double):
    """The same two documents ingested into a workspace an owner runs from the admin and into another."""
    from knowledge.services import ingestion
    from tests.knowledge.ingest_helpers import DOC_A, DOC_B, answer

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MIN_TOKENS = 1, 0
    openai_double.reply(answer)
    owner = make_user("owner", is_staff=True, is_superuser=True)
    by_admin = make_workspace(slug="by-admin", members={owner: Role.OWNER})
    by_service = make_workspace(slug="by-service")
    for workspace in (by_admin, by_service):
        for name, text in (("a.txt", DOC_A), ("b.txt", DOC_B)):
            document = ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)
            ingestion.document_ingest(document_id=document.pk)
    return owner, by_admin, by_service


def _as_the_service_leaves_it(by_admin, by_service):
    from knowledge.models import Document, GraphRebuild
    from knowledge.services import ingestion
    from tests.knowledge.ingest_helpers import graph_dump

    # The rebuild the admin queued for a worker, run here.
    for rebuild in GraphRebuild.objects.filter(workspace=by_admin):
        assert ingestion.graph_rebuild_run(rebuild_id=rebuild.pk)
    ingestion.document_delete(document=Document.objects.get(workspace=by_service, title="a.txt"))
    by_admin.refresh_from_db()
    by_service.refresh_from_db()
    assert graph_dump(by_admin) == graph_dump(by_service)
    assert (by_admin.entity_count, by_admin.relation_count, by_admin.chunk_count) == (
        by_service.entity_count,
        by_service.relation_count,
        by_service.chunk_count,
    )


def test_an_admin_delete_leaves_the_graph_the_deletion_service_leaves(client, two_graphs):
    from knowledge.models import Document

    owner, by_admin, by_service = two_graphs
    doomed = Document.objects.get(workspace=by_admin, title="a.txt")
    client.force_login(owner)

    response = client.post(reverse("admin:knowledge_document_delete", args=[doomed.pk]), {"post": "yes"})

    assert response.status_code == 302
    _as_the_service_leaves_it(by_admin, by_service)
    event = AuditEvent.objects.get(workspace=by_admin, action="document.delete")
    assert event.actor == owner


def test_deleting_selected_documents_in_the_admin_goes_through_the_deletion_service(client, two_graphs):
    from knowledge.models import Document

    owner, by_admin, by_service = two_graphs
    doomed = Document.objects.get(workspace=by_admin, title="a.txt")
    client.force_login(owner)
    changelist = reverse("admin:knowledge_document_changelist")
    selection = {"action": "delete_selected", "_selected_action": [doomed.pk]}

    confirm = client.post(changelist, selection)
    response = client.post(changelist, {**selection, "post": "yes"})

    assert "a.txt" in confirm.content.decode()
    assert response.status_code == 302
    _as_the_service_leaves_it(by_admin, by_service)
    assert AuditEvent.objects.filter(workspace=by_admin, action="document.delete", actor=owner).count() == 1


def test_staff_cannot_edit_what_a_documents_run_owns(client, two_graphs):
    from knowledge.models import Document

    owner, by_admin, by_service = two_graphs
    document = Document.objects.get(workspace=by_admin, title="a.txt")
    client.force_login(owner)
    change = reverse("admin:knowledge_document_change", args=[document.pk])

    page = client.get(change).content.decode()
    client.post(
        change,
        {"title": "Renamed", "workspace": by_service.pk, "status": "pending", "stage": "queued", "lease_owner": "x:1"},
    )

    for field in ("workspace", "status", "stage", "lease_owner", "lease_expires_at", "chunk_count"):
        assert f'name="{field}"' not in page
    assert 'name="title"' in page
    document.refresh_from_db()
    assert (document.title, document.workspace_id, document.status, document.stage, document.lease_owner) == (
        "Renamed",
        by_admin.pk,
        "processed",
        "done",
        "",
    )
