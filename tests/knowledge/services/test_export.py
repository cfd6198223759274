import csv
import io
import json
import zipfile
from io import StringIO

import networkx as nx
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import AsyncClient
from django.urls import reverse

from knowledge.models import Document, EntitySource, Workspace
from knowledge.services import ingestion
from tests.factories import make_chunk, make_entity, make_relation
from tests.knowledge.ingest_helpers import DOC_A, DOC_B, answer

UNFINISHED = "Secret Project"


def _ingest(workspace, name: str, text: str) -> Document:
    document = ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)
    return ingestion.document_ingest(document_id=document.pk)


@pytest.fixture
def graph(openai_double, workspace):
    """The two-document corpus, an entity whose description needs escaping, and the rows of a
    document still being ingested (unpublished, never to be exported)."""
    openai_double.reply(answer)
    _ingest(workspace, "a.txt", DOC_A)
    _ingest(workspace, "b.txt", DOC_B)
    odd = make_entity(workspace, "Formula <&> Co", type="organization", description='=HYPERLINK("x") \x0b<tag> & "q"')
    make_relation(odd, workspace.entities.get(key="berlin"), weight=2.5, keywords="@office")
    unfinished = Document.objects.create(
        workspace=workspace, title="draft.txt", content_hash="draft", status=Document.Status.PROCESSING
    )
    hidden = make_entity(workspace, UNFINISHED, published=False)
    make_relation(hidden, workspace.entities.get(key="acme corp"), published=False)
    EntitySource.objects.create(
        entity=workspace.entities.get(key="acme corp"), chunk=make_chunk(unfinished), name="Acme", description="draft"
    )
    from knowledge.services.workspaces import workspace_refresh_counts

    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()
    return workspace


def _download(client, workspace, format) -> bytes:  # noqa: A002
    response = client.get(reverse("knowledge:graph_export", args=[workspace.slug, format]))
    assert response.status_code == 200
    return b"".join(response.streaming_content), response


@pytest.fixture
def member(client, owner):
    client.force_login(owner)
    return client


def test_the_graphml_loads_in_networkx_with_the_workspace_counts_and_typed_attributes(graph, member):
    content, response = _download(member, graph, "graphml")

    loaded = nx.read_graphml(io.BytesIO(content))
    assert response["Content-Disposition"] == 'attachment; filename="acme-graph.graphml"'
    assert response["Content-Type"] == "application/graphml+xml"
    assert (loaded.number_of_nodes(), loaded.number_of_edges()) == (graph.entity_count, graph.relation_count) == (5, 4)
    assert not loaded.is_directed()
    nodes = {data["label"]: data for _, data in loaded.nodes(data=True)}
    assert UNFINISHED not in nodes
    assert nodes["Acme Corp"]["degree"] == 3
    assert isinstance(nodes["Acme Corp"]["degree"], int)
    assert nodes["Acme Corp"]["sources"] == 2  # one chunk of each document; the draft's is not counted
    assert nodes["Acme Corp"]["type"] == "organization"
    assert nodes["Formula <&> Co"]["description"] == '=HYPERLINK("x") <tag> & "q"'
    weights = {
        frozenset((loaded.nodes[a]["label"], loaded.nodes[b]["label"])): data["weight"]
        for a, b, data in loaded.edges(data=True)
    }
    assert weights[frozenset(("Formula <&> Co", "Berlin"))] == 2.5
    assert all(isinstance(weight, float) for weight in weights.values())


def test_the_graphml_declares_each_attribute_with_its_type(graph, member):
    content, _ = _download(member, graph, "graphml")

    text = content.decode()
    assert '<key id="n_degree" for="node" attr.name="degree" attr.type="int"/>' in text
    assert '<key id="e_weight" for="edge" attr.name="weight" attr.type="double"/>' in text
    assert '<key id="n_label" for="node" attr.name="label" attr.type="string"/>' in text


def test_the_csv_zip_holds_entities_relations_and_provenance_of_published_rows(graph, member):
    content, response = _download(member, graph, "csv")

    archive = zipfile.ZipFile(io.BytesIO(content))
    assert response["Content-Type"] == "application/zip"
    assert archive.namelist() == ["entities.csv", "relations.csv", "provenance.csv"]
    tables = {name: list(csv.DictReader(io.StringIO(archive.read(name).decode()))) for name in archive.namelist()}
    assert len(tables["entities.csv"]) == graph.entity_count
    assert len(tables["relations.csv"]) == graph.relation_count
    assert UNFINISHED not in {row["name"] for row in tables["entities.csv"]}
    odd = next(row for row in tables["entities.csv"] if row["name"] == "Formula <&> Co")
    assert odd["description"].startswith("'=HYPERLINK")  # a spreadsheet shows it instead of running it
    provenance = tables["provenance.csv"]
    assert {row["document_title"] for row in provenance} == {"a.txt", "b.txt"}
    assert {row["kind"] for row in provenance} == {"entity", "relation"}
    entity_ids = {row["id"] for row in tables["entities.csv"]}
    assert {row["row_id"] for row in provenance if row["kind"] == "entity"} <= entity_ids


def test_the_json_is_networkx_node_link_data_with_provenance(graph, member):
    content, _ = _download(member, graph, "json")

    data = json.loads(content)
    loaded = nx.node_link_graph(data, edges="edges")
    assert (loaded.number_of_nodes(), loaded.number_of_edges()) == (graph.entity_count, graph.relation_count)
    assert data["graph"]["workspace"] == "acme"
    assert {row["document_title"] for row in data["provenance"]} == {"a.txt", "b.txt"}
    assert UNFINISHED not in {node["label"] for node in data["nodes"]}


def test_an_unknown_format_is_not_found(graph, member):
    assert member.get(reverse("knowledge:graph_export", args=[graph.slug, "xlsx"])).status_code == 404


def test_the_graph_page_offers_every_format(graph, member):
    page = member.get(reverse("knowledge:graph", args=[graph.slug])).content.decode()

    for name in ("graphml", "csv", "json"):
        assert reverse("knowledge:graph_export", args=[graph.slug, name]) in page


def test_the_command_writes_each_format_to_a_file(graph, tmp_path):
    for name in ("graphml", "csv", "json"):
        target = tmp_path / f"out.{name}"
        errors = StringIO()
        call_command("export_graph", "--workspace", graph.slug, "--format", name, "-o", str(target), stderr=errors)
        assert target.stat().st_size > 0
        assert str(target) in errors.getvalue()

    loaded = nx.read_graphml(tmp_path / "out.graphml")
    assert loaded.number_of_nodes() == graph.entity_count


def _close_connection():
    connection.close()


@pytest.mark.django_db(transaction=True)
async def test_under_asgi_the_export_streams_from_a_thread_of_its_own(graph, owner):
    from asgiref.sync import sync_to_async

    client = AsyncClient()
    await sync_to_async(client.force_login)(owner)
    workspace = await Workspace.objects.aget(pk=graph.pk)

    response = await client.get(reverse("knowledge:graph_export", args=[workspace.slug, "graphml"]))

    assert response.status_code == 200
    assert response.is_async
    content = b"".join([block async for block in response.streaming_content])
    loaded = nx.read_graphml(io.BytesIO(content))
    assert (loaded.number_of_nodes(), loaded.number_of_edges()) == (workspace.entity_count, workspace.relation_count)
    # The view's permission check ran on asgiref's thread, whose connection would outlive the test database.
    await sync_to_async(_close_connection)()
