"""Conversation history in retrieval: a question that stands on its own retrieves for itself,
a follow-up retrieves what it refers to (knowledge/rag/retrieval/history.py)."""

import pytest

from knowledge.rag.answer.extractive import extractive_answer
from knowledge.rag.retrieval import retrieve
from knowledge.rag.retrieval.history import is_follow_up, referred_turns
from knowledge.services.evaluation.recall import synthetic_corpus_ingest
from knowledge.services.evaluation.synthetic import synthetic_corpus
from tests.knowledge.team_graph import build_team_graph

SEARCH_MODES = ("naive", "local", "global", "hybrid", "mix")


@pytest.mark.parametrize(
    "question",
    [
        "and who founded it?",
        "What about its price?",
        "and the second one?",
        "How do I install it on Debian?",
        "Which of them is the oldest?",
        "Who lives there?",
        "Why?",
        "Does it support PDF?",
    ],
)
def test_it_takes_a_question_that_points_back_for_a_follow_up(question):
    assert is_follow_up(question)


@pytest.mark.parametrize(
    "question",
    [
        "Who founded Acme and where is it based?",
        "Where is Nordwind Labs headquartered?",
        "Is it true that Acme makes pumps?",
        "How long does it take to install Frobnicator?",
        "Is there a way to pin packages?",
        "What is a knowledge graph?",
        "In which city is the company that employs Nora Moreau headquartered?",
    ],
)
def test_it_takes_a_question_that_names_what_it_asks_about_as_standing_alone(question):
    assert not is_follow_up(question)


def test_a_follow_up_refers_back_to_the_last_question_that_stood_alone():
    history = [
        {"role": "user", "content": "Where is Acme based?"},
        {"role": "assistant", "content": "In Oslo."},
        {"role": "user", "content": "Who founded Nordwind?"},
        {"role": "assistant", "content": "Ada."},
        {"role": "user", "content": "And when?"},
        {"role": "assistant", "content": "In 1990."},
    ]

    assert referred_turns("Where is it based?", history) == history[2:]
    assert referred_turns("Who founded Calder?", history) == []
    assert referred_turns("Where is it based?", []) == []


@pytest.fixture
def companies(workspace, settings):
    """Two company profiles and two staff profiles, ingested with the embedded defaults."""
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    corpus = synthetic_corpus(seed=7, people=2, companies=2)
    synthetic_corpus_ingest(workspace=workspace, corpus=corpus)
    return [document.title.removeprefix("Company profile: ") for document in corpus.documents[:2]]


def test_a_conversation_that_changes_topic_retrieves_the_new_topic_and_its_follow_ups(workspace, companies):
    old, new = companies
    history = [
        {"role": "user", "content": f"Where is {old} headquartered?"},
        {"role": "assistant", "content": f"{old} is headquartered in Rotterdam. [S1]"},
    ]
    # top_k 5 and chunk_top_k 2 on four documents are about what the defaults are on a real workspace.
    options = {"workspace": workspace, "top_k": 5, "chunk_top_k": 2}
    new_profile = f"Company profile: {new}"
    for mode in SEARCH_MODES:
        changed = retrieve(question=f"Who founded {new}?", mode=mode, history=history, **options)
        alone = retrieve(question=f"Who founded {new}?", mode=mode, **options)

        # The earlier topic leaves no trace: the same keywords and sources as the question alone.
        assert changed.keywords == alone.keywords, mode
        assert [row.chunk_id for row in changed.chunks] == [row.chunk_id for row in alone.chunks], mode
        assert old not in changed.keywords.low_level + changed.keywords.high_level
        if mode != "global":  # global searches relations with the themes ("found") alone, by design
            assert new_profile in [row.document_title for row in changed.chunks], mode

        follow_up = retrieve(
            question="And where is it headquartered?",
            mode=mode,
            history=[
                *history,
                {"role": "user", "content": f"Who founded {new}?"},
                {"role": "assistant", "content": "Someone. [S1]"},
            ],
            **options,
        )

        assert new_profile in [row.document_title for row in follow_up.chunks], mode
        answer = extractive_answer("And where is it headquartered?", follow_up)
        assert f"{new} is headquartered in" in answer, mode
        assert f"{old} is headquartered in" not in answer, mode
        if mode != "naive":
            assert new in follow_up.keywords.low_level
            assert old not in follow_up.keywords.low_level + follow_up.keywords.high_level


def test_with_a_chat_model_only_a_follow_up_sends_the_earlier_turns_to_the_searches(workspace, openai_double):
    build_team_graph(workspace)
    openai_double.reply('{"high_level_keywords": ["people"], "low_level_keywords": ["Bob"]}')
    history = [
        {"role": "user", "content": "Tell me about Alice."},
        {"role": "assistant", "content": "Alice joined in 2020. [S1]"},
    ]

    retrieve(workspace=workspace, question="Who is Bob?", mode="mix", history=history)
    retrieve(workspace=workspace, question="And who does she work with?", mode="mix", history=history)

    standalone, follow_up = openai_double.chat_requests()
    assert "Tell me about Alice." not in standalone.last_user_message
    assert "Tell me about Alice." in follow_up.last_user_message
    asked = [request.body["input"][-1] for request in openai_double.embedding_requests()]
    assert asked == ["Who is Bob?", "Tell me about Alice.\nAnd who does she work with?"]
