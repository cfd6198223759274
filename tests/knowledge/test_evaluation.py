import json

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from knowledge.evaluation.judging import parse_verdict, verdicts_for_systems, win_rates
from knowledge.evaluation.questions import EvaluationError, evaluation_set_generate, parse_list
from knowledge.models import EvaluationSet
from tests.factories import make_chunk, make_document, make_entity, make_user


def verdict(**winners) -> str:
    return json.dumps(
        {
            criterion: {"winner": f"Answer {position}", "reason": f"{criterion} reason"}
            for criterion, position in winners.items()
        }
    )


ALL_FIRST = verdict(comprehensiveness=1, diversity=1, empowerment=1, overall=1)


# Reading the judge --------------------------------------------------------------------------


def test_it_reads_a_verdict_wrapped_in_code_fences_and_prose():
    raw = (
        "Sure! Here is my judgement:\n```json\n"
        + verdict(comprehensiveness=2, diversity=1, empowerment=2, overall=2)
        + "\n```\nHope it helps."
    )

    parsed = parse_verdict(raw)

    assert parsed.problems == []
    assert {criterion: position for criterion, (position, _) in parsed.positions.items()} == {
        "comprehensiveness": 2,
        "diversity": 1,
        "empowerment": 2,
        "overall": 2,
    }
    assert parsed.positions["diversity"][1] == "diversity reason"


def test_it_reads_the_papers_key_names_and_bare_winners():
    raw = json.dumps(
        {
            "Comprehensiveness": {"Winner": "Answer 2", "Explanation": "more detail"},
            "Diversity": "Answer 1",
            "Empowerment": {"Winner": 2, "Explanation": "clearer"},
            "Overall Winner": {"Winner": "the second answer", "Explanation": "wins two of three"},
        }
    )

    parsed = parse_verdict(raw)

    assert parsed.problems == []
    assert parsed.positions == {
        "comprehensiveness": (2, "more detail"),
        "diversity": (1, ""),
        "empowerment": (2, "clearer"),
        "overall": (2, "wins two of three"),
    }


def test_it_records_what_it_could_not_read_instead_of_guessing():
    parsed = parse_verdict(
        json.dumps({"comprehensiveness": {"winner": "Answer 1 and Answer 2 tie"}, "diversity": {"winner": "Answer 1"}})
    )

    assert parsed.positions == {"diversity": (1, "")}
    assert parsed.problems == [
        "comprehensiveness: no clear winner in 'Answer 1 and Answer 2 tie'",
        "empowerment: missing",
        "overall: missing",
    ]
    assert parse_verdict("I cannot decide.").problems == ["the reply holds no JSON object"]


def test_it_maps_positions_back_to_systems_for_each_order():
    parsed = parse_verdict(verdict(comprehensiveness=1, diversity=2, empowerment=1, overall=2))

    assert {c: v["winner"] for c, v in verdicts_for_systems(parsed, order="ab").items()} == {
        "comprehensiveness": "a",
        "diversity": "b",
        "empowerment": "a",
        "overall": "b",
    }
    assert {c: v["winner"] for c, v in verdicts_for_systems(parsed, order="ba").items()} == {
        "comprehensiveness": "b",
        "diversity": "a",
        "empowerment": "b",
        "overall": "a",
    }


def test_it_counts_each_judgement_as_one_vote_and_leaves_unreadable_ones_out():
    a_wins = {"comprehensiveness": {"winner": "a"}, "diversity": {"winner": "a"}}
    b_wins = {"comprehensiveness": {"winner": "b"}, "diversity": {"winner": "a"}}

    rates = win_rates([a_wins, a_wins, a_wins, b_wins])

    assert rates["comprehensiveness"] == {
        "a_wins": 3,
        "b_wins": 1,
        "unreadable": 0,
        "a_percent": 75.0,
        "b_percent": 25.0,
    }
    assert rates["diversity"]["a_percent"] == 100.0
    assert rates["overall"] == {"a_wins": 0, "b_wins": 0, "unreadable": 4, "a_percent": None, "b_percent": None}


# Generating questions ------------------------------------------------------------------------


def test_it_reads_lists_as_json_or_as_numbered_lines():
    assert parse_list('```json\n["one", "two", "three"]\n```', count=2) == ["one", "two"]
    assert parse_list('{"users": ["a  researcher", "a clerk"]}', count=5) == ["a researcher", "a clerk"]
    assert parse_list("Here you go:\n1. What changed?\n2) Why?\n- How?\n", count=5) == ["What changed?", "Why?", "How?"]


@pytest.fixture
def corpus(workspace):
    document = make_document(workspace, title="Harbour report")
    for order in range(3):
        make_chunk(document, order=order, text=f"The harbour of Velmar handled {order + 1} million tonnes.")
    make_entity(workspace, "Velmar", type="location", description="A port town.")
    return workspace


def _generator(body: dict) -> str:
    prompt = body["messages"][-1]["content"]
    if "describe the collection" in prompt:
        return "Annual reports about the harbour of Velmar."
    if "Imagine 2 different people" in prompt:
        return '```json\n["A port economist.", "A city councillor."]\n```'
    if "List 2 different tasks" in prompt:
        persona = prompt.split("One of its users: ")[1].split("\n")[0]
        return json.dumps([f"{persona} task one", f"{persona} task two"])
    task = prompt.split("The task at hand: ")[1].split("\n")[0]
    return "\n".join(f"{n}. Q{n} for {task}?" for n in (1, 2, 3))


def test_it_generates_users_times_tasks_times_questions_and_stores_them(corpus, openai_double, owner):
    openai_double.reply(_generator)

    evaluation_set = evaluation_set_generate(
        workspace=corpus, name="harbour", users=2, tasks=2, questions=3, created_by=owner
    )

    questions = list(evaluation_set.questions.all())
    assert len(questions) == 12
    assert evaluation_set.corpus_description == "Annual reports about the harbour of Velmar."
    assert questions[0].persona == "A port economist."
    assert questions[0].task == "A port economist. task one"
    assert questions[0].text == "Q1 for A port economist. task one?"
    assert questions[-1].text == "Q3 for A city councillor. task two?"
    # 1 description + 1 users + 2 task lists + 4 question lists
    assert len(openai_double.chat_requests()) == 8
    assert evaluation_set.generation["llm_calls"] == 8
    assert evaluation_set.generation["prompt_tokens"] > 0
    describe_prompt = openai_double.chat_requests()[0].last_user_message
    assert "Velmar handled 1 million tonnes" in describe_prompt
    assert "Velmar (location): A port town." in describe_prompt


def test_it_refuses_to_generate_questions_without_a_chat_model(corpus, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""

    with pytest.raises(EvaluationError, match="needs a chat model"):
        evaluation_set_generate(workspace=corpus, name="x")
    with pytest.raises(CommandError, match="needs a chat model"):
        call_command("generate_questions", workspace="acme", name="x")
    assert not EvaluationSet.objects.exists()


def test_it_keeps_nothing_when_the_model_does_not_return_a_list(corpus, openai_double):
    openai_double.reply(lambda body: "I'd rather not." if "Imagine" in body["messages"][-1]["content"] else "A corpus.")

    with pytest.raises(EvaluationError, match="listing users held no list"):
        evaluation_set_generate(workspace=corpus, name="x")
    assert not EvaluationSet.objects.exists()


def test_it_generates_a_named_set_through_the_command(corpus, openai_double, capsys):
    openai_double.reply(_generator)

    call_command("generate_questions", workspace="acme", name="harbour", users=2, tasks=2, questions=3)

    assert EvaluationSet.objects.get(name="harbour").questions.count() == 12
    assert "Stored 12 questions as evaluation set 'harbour'" in capsys.readouterr().out
    with pytest.raises(CommandError, match="already has an evaluation set named 'harbour'"):
        call_command("generate_questions", workspace="acme", name="harbour")


def test_it_lets_an_admin_edit_the_questions_of_a_set(client, workspace):
    evaluation_set = EvaluationSet.objects.create(workspace=workspace, name="harbour")
    question = evaluation_set.questions.create(order=0, text="What drives the harbour's growth?")
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    url = reverse("admin:knowledge_evaluationset_change", args=[evaluation_set.pk])
    page = client.get(url)
    assert page.status_code == 200
    assert b"What drives the harbour" in page.content
    form = {
        "workspace": workspace.pk,
        "name": "harbour",
        "corpus_description": "",
        "questions-TOTAL_FORMS": 1,
        "questions-INITIAL_FORMS": 1,
        "questions-0-id": question.pk,
        "questions-0-evaluation_set": evaluation_set.pk,
        "questions-0-order": 0,
        "questions-0-text": "How has the harbour changed since 1990?",
    }

    response = client.post(url, form)

    assert response.status_code == 302
    question.refresh_from_db()
    assert question.text == "How has the harbour changed since 1990?"
