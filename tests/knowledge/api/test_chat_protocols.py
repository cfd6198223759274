"""Model names, messages and LightRAG's prefixes, as the OpenAI and Ollama APIs read them."""

import pytest

from knowledge.api.protocols import (
    SOURCES_HEADING,
    Model,
    UnknownModel,
    chat_request,
    conversation,
    parse_model,
    sources_text,
)
from knowledge.services.asking import AskInvalid


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("acme", Model("acme", None)),
        ("acme:latest", Model("acme", None)),
        ("acme:local", Model("acme", "local")),
        ("acme:bypass", Model("acme", "bypass")),
        ("acme/handbook", Model("acme", None, "handbook")),
        ("acme/handbook:latest", Model("acme", None, "handbook")),
        ("acme/handbook:local", Model("acme", "local", "handbook")),
    ],
)
def test_it_reads_a_model_name_as_a_workspace_and_a_mode(name, model):
    assert parse_model(name) == model


def test_a_model_named_after_a_tag_scopes_the_question_to_it():
    request = chat_request(model=parse_model("acme/Handbook:local"), question="Who?")

    assert (request.mode, request.scope.tags, request.scope.documents) == ("local", ("handbook",), ())


@pytest.mark.parametrize("name", ["acme:deep", "", None, 3])
def test_it_refuses_names_that_name_no_mode(name):
    with pytest.raises(UnknownModel):
        parse_model(name)


@pytest.mark.parametrize(
    ("question", "mode", "context_only", "asked", "response_type"),
    [
        ("/local Who is Bob?", "local", False, "Who is Bob?", "Multiple Paragraphs"),
        ("/context Who is Bob?", "hybrid", True, "Who is Bob?", "Multiple Paragraphs"),
        ("/naivecontext Who is Bob?", "naive", True, "Who is Bob?", "Multiple Paragraphs"),
        ("/global[Bullet Points] Who is Bob?", "global", False, "Who is Bob?", "Bullet Points"),
        ("/[Bullet Points] Who is Bob?", "hybrid", False, "Who is Bob?", "Bullet Points"),
        ("/etc/hosts lists what?", "hybrid", False, "/etc/hosts lists what?", "Multiple Paragraphs"),
        ("/ Who is Bob?", "hybrid", False, "/ Who is Bob?", "Multiple Paragraphs"),
        ("/contextual Who?", "hybrid", False, "/contextual Who?", "Multiple Paragraphs"),
    ],
)
def test_a_prefix_chooses_the_mode_over_the_model(question, mode, context_only, asked, response_type):
    request = chat_request(model=Model("acme", "hybrid"), question=question)

    assert (request.mode, request.context_only, request.question, request.response_type) == (
        mode,
        context_only,
        asked,
        response_type,
    )


def test_open_webui_tasks_are_bypassed():
    task = "### Task:\nSuggest a title.\n<chat_history>\nUSER: Who is Bob?\n</chat_history>"

    assert chat_request(model=Model("acme", None), question=task).mode == "bypass"


def test_the_history_keeps_user_and_assistant_turns_without_their_sources():
    answer = "Bob works with Carol [R1]." + sources_text(
        [
            {
                "id": "R1",
                "kind": "relation",
                "label": "Bob – Carol",
                "document_title": "Team notes",
                "section": "",
                "location": "",
                "url": "",
            }
        ]
    )

    question, history = conversation(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Who?"}, {"type": "image_url", "image_url": {}}]},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And Carol?"},
        ]
    )

    assert SOURCES_HEADING in answer
    assert question == "And Carol?"
    assert history == [
        {"role": "user", "content": "Who?"},
        {"role": "assistant", "content": "Bob works with Carol [R1]."},
    ]


@pytest.mark.parametrize("messages", [[], "Hi", [{"role": "assistant", "content": "Hi"}], [{"role": "user"}]])
def test_it_refuses_messages_without_a_question_last(messages):
    with pytest.raises(AskInvalid):
        conversation(messages)
