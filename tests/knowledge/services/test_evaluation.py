import json

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from knowledge.models import EvaluationRun, EvaluationSet, Membership, Role
from knowledge.services.evaluation.judging import parse_verdict, verdicts_for_systems, win_rates
from knowledge.services.evaluation.questions import EvaluationError, evaluation_set_generate, parse_list
from knowledge.services.evaluation.systems import sub_questions
from knowledge.services.workspaces import workspace_refresh_counts
from tests.factories import make_chunk, make_document, make_entity, make_relation, make_user


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


# Evaluating two systems end to end ---------------------------------------------------------

GRAPH, PASSAGES = "GRAPH", "PASSAGES"
# The modes are asked through the ask service, which retrieves on pool threads with connections
# of their own; those see only what is committed.
answering = pytest.mark.django_db(transaction=True)
QUESTIONS = ["How do the harbours compete?", "What shaped Velmar's trade?", "Who gains from the new port?"]


def _answer_1_and_2(prompt: str) -> tuple[str, str]:
    first = prompt.split("---Answer 1---\n", 1)[1].split("\n\n---Answer 2---", 1)[0]
    second = prompt.split("---Answer 2---\n", 1)[1].split("\n\nCompare the two answers", 1)[0]
    return first, second


def _scripted_judge(question: str, first: str, second: str) -> str:
    """Verdicts chosen per system, so only a correct position-to-system mapping gives the expected table."""
    number = QUESTIONS.index(question) + 1
    graph_first = first.startswith(GRAPH)
    if number == 3 and not graph_first:
        return "I would rather not choose between these."

    def position_of(system: str) -> int:
        return 1 if (system == GRAPH) == graph_first else 2

    verdicts = {
        "comprehensiveness": position_of(GRAPH),
        "diversity": "Answer 1 and Answer 2" if number == 1 and graph_first else position_of(PASSAGES),
        "empowerment": 1,  # pure position bias: the swap must cancel it out
        "overall": position_of(GRAPH if number < 3 else PASSAGES),
    }
    body = json.dumps(
        {
            criterion: {
                "winner": value if isinstance(value, str) else f"Answer {value}",
                "reason": f"{criterion} {number}",
            }
            for criterion, value in verdicts.items()
        }
    )
    return f"Here is my verdict:\n```json\n{body}\n```" if number == 2 else body


def _evaluation_double(body: dict) -> str:
    system = body["messages"][0]["content"]
    prompt = body["messages"][-1]["content"]
    if system.startswith("You extract search keywords"):
        return '{"high_level_keywords": ["harbour trade"], "low_level_keywords": ["Velmar"]}'
    if system.startswith("You are an impartial expert judging"):
        question = prompt.split("Question: ", 1)[1].split("\n", 1)[0]
        return _scripted_judge(question, *_answer_1_and_2(prompt))
    # An answer: the graph modes put an entities table into the context, naive does not.
    source = GRAPH if "-----Entities-----" in system else PASSAGES
    return f"{source} answer to: {prompt}"


@pytest.fixture
def harbour(workspace, openai_double, settings):
    vector = [1.0] + [0.0] * (settings.EMBEDDING_DIM - 1)
    # Every text embeds to the same vector, so every row is retrieved whatever the question.
    openai_double.embedding_handler = lambda text: vector
    openai_double.reply(_evaluation_double)
    document = make_document(workspace, title="Harbour report")
    make_chunk(document, text="Velmar's harbour grew as Ostrand's declined.", embedding=vector)
    velmar = make_entity(workspace, "Velmar", type="location", description="A port town.", embedding=vector)
    ostrand = make_entity(workspace, "Ostrand", type="location", description="A rival port.", embedding=vector)
    make_relation(velmar, ostrand, description="Rival harbours.", keywords="competition", embedding=vector)
    workspace_refresh_counts(workspace_id=workspace.pk)
    evaluation_set = EvaluationSet.objects.create(workspace=workspace, name="harbour")
    for order, text in enumerate(QUESTIONS):
        evaluation_set.questions.create(order=order, text=text)
    return workspace


@answering
def test_it_judges_each_pair_twice_swapped_and_maps_verdicts_back_to_systems(harbour, openai_double, capsys):
    call_command("evaluate", workspace="acme", set_name="harbour", a="mix", b="naive", judge_model="judge-1")

    run = EvaluationRun.objects.get()
    assert run.status == EvaluationRun.Status.FINISHED
    rates = run.summary["win_rates"]
    assert rates["comprehensiveness"] == {
        "a_wins": 5,
        "b_wins": 0,
        "unreadable": 1,
        "a_percent": 100.0,
        "b_percent": 0.0,
    }
    assert rates["diversity"] == {"a_wins": 0, "b_wins": 4, "unreadable": 2, "a_percent": 0.0, "b_percent": 100.0}
    assert rates["empowerment"] == {"a_wins": 3, "b_wins": 2, "unreadable": 1, "a_percent": 60.0, "b_percent": 40.0}
    assert rates["overall"] == {"a_wins": 4, "b_wins": 1, "unreadable": 1, "a_percent": 80.0, "b_percent": 20.0}

    judgements = {(j.question.order, j.order): j for j in run.judgements.select_related("question")}
    assert len(judgements) == 6
    assert judgements[(0, "ab")].verdicts["comprehensiveness"] == {"winner": "a", "reason": "comprehensiveness 1"}
    assert judgements[(0, "ba")].verdicts["comprehensiveness"] == {"winner": "a", "reason": "comprehensiveness 1"}
    assert judgements[(0, "ba")].verdicts["empowerment"]["winner"] == "b"
    assert "diversity: no clear winner" in judgements[(0, "ab")].error
    assert judgements[(2, "ba")].verdicts == {}
    assert judgements[(2, "ba")].raw == "I would rather not choose between these."
    assert run.summary["unreadable_judgements"] == 2

    out = capsys.readouterr().out
    assert "NaiveRAG (B)" in out
    assert "LightRAG (mix) (A)" in out
    assert [line.split()[1:] for line in out.splitlines() if line.startswith(("Comprehensiveness", "Overall"))] == [
        ["0.0%", "100.0%"],
        ["20.0%", "80.0%"],
    ]


@answering
def test_it_stores_both_answers_with_their_cost_and_uses_the_judge_model(harbour, openai_double):
    call_command("evaluate", workspace="acme", set_name="harbour", a="mix", b="naive", judge_model="judge-1")

    run = EvaluationRun.objects.get()
    answers = {(answer.question.order, answer.system): answer for answer in run.answers.select_related("question")}
    assert answers[(1, "mix")].text.startswith("GRAPH answer to: What shaped Velmar's trade?")
    assert answers[(1, "naive")].text.startswith("PASSAGES answer to: What shaped Velmar's trade?")
    # mix: keywords + one embedding request + the answer; naive: one embedding request + the answer.
    assert {answer.llm_calls for (_, system), answer in answers.items() if system == "mix"} == {3}
    assert {answer.llm_calls for (_, system), answer in answers.items() if system == "naive"} == {2}
    assert all(answer.prompt_tokens > 0 and answer.completion_tokens > 0 for answer in answers.values())
    assert all(answer.context_tokens > 0 for answer in answers.values())
    cost = run.summary["cost"]
    assert cost["mix"]["calls_per_query"] == 3.0
    assert cost["naive"]["calls_per_query"] == 2.0
    assert cost["mix"]["prompt_tokens_per_query"] == round(
        sum(a.prompt_tokens for (_, s), a in answers.items() if s == "mix") / 3, 1
    )
    judge_requests = [
        r for r in openai_double.chat_requests() if r.messages[0]["content"].startswith("You are an impartial")
    ]
    answer_requests = [r for r in openai_double.chat_requests() if r.body.get("stream")]
    assert len(judge_requests) == 6
    assert {r.body["model"] for r in judge_requests} == {"judge-1"}
    assert {r.body["model"] for r in answer_requests} == {"double-chat"}
    assert run.summary["judge"]["calls"] == 6
    assert run.judge_model == "judge-1"
    assert run.answer_model == "double-chat"


@answering
def test_it_records_a_failed_answer_and_leaves_that_pair_unjudged(harbour, openai_double):
    def failing_naive(body):
        if (
            body.get("stream")
            and "-----Entities-----" not in body["messages"][0]["content"]
            and "harbours" in body["messages"][-1]["content"]
        ):
            raise RuntimeError("model crashed")
        return _evaluation_double(body)

    openai_double.reply(failing_naive)

    call_command("evaluate", workspace="acme", set_name="harbour", a="mix", b="naive")

    run = EvaluationRun.objects.get()
    failed = run.answers.get(system="naive", question__order=0)
    assert "an owner should check LLM settings" in failed.error  # viewers read runs: no endpoint
    assert run.status == EvaluationRun.Status.FINISHED
    assert run.judgements.filter(question__order=0, error__startswith="not judged").count() == 2
    assert run.summary["cost"]["naive"]["failed"] == 1
    assert (
        run.summary["win_rates"]["comprehensiveness"]["a_wins"]
        + run.summary["win_rates"]["comprehensiveness"]["b_wins"]
        == 3
    )


def test_it_refuses_to_evaluate_without_a_chat_model(harbour, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""

    with pytest.raises(CommandError, match="Evaluating needs a chat model"):
        call_command("evaluate", workspace="acme", set_name="harbour")
    assert not EvaluationRun.objects.exists()


def test_it_names_the_sets_there_are_when_the_set_is_unknown(harbour):
    with pytest.raises(CommandError, match="No evaluation set 'nope' in 'acme'. Sets: harbour."):
        call_command("evaluate", workspace="acme", set_name="nope")


# The evaluation page ------------------------------------------------------------------------


@answering
def test_it_shows_a_viewer_the_run_in_the_papers_layout(harbour, client):
    call_command("evaluate", workspace="acme", set_name="harbour", a="mix", b="naive")
    run = EvaluationRun.objects.get()
    viewer = make_user("viewer")
    Membership.objects.create(user=viewer, workspace=harbour, role=Role.VIEWER)
    client.force_login(viewer)

    listing = client.get(reverse("knowledge:evaluation", args=["acme"]))
    page = client.get(reverse("knowledge:evaluation_run", args=["acme", run.pk]))

    assert listing.status_code == 200
    assert reverse("knowledge:evaluation_run", args=["acme", run.pk]).encode() in listing.content
    assert page.status_code == 200
    assert [row["label"] for row in page.context["table"]] == [
        "Comprehensiveness",
        "Diversity",
        "Empowerment",
        "Overall",
    ]
    html = page.content.decode()
    assert '<th scope="row">Overall</th>' in html
    assert "80.0%" in html
    assert "20.0%" in html
    assert "GRAPH answer to: Who gains from the new port?" in html
    assert "I would rather not choose between these." in html


def test_it_hides_runs_from_non_members(harbour, client):
    run = EvaluationRun.objects.create(
        workspace=harbour, evaluation_set=EvaluationSet.objects.get(), system_a="mix", system_b="naive"
    )
    client.force_login(make_user("stranger"))

    assert client.get(reverse("knowledge:evaluation", args=["acme"])).status_code == 404
    assert client.get(reverse("knowledge:evaluation_run", args=["acme", run.pk])).status_code == 404


# The paper's baselines as retrieval variants -------------------------------------------------


def _baselines_double(body: dict) -> str:
    prompt = body["messages"][-1]["content"]
    if prompt.startswith("Write a short passage"):
        return "Velmar's harbour overtook Ostrand in 1990."
    if prompt.startswith("Break this question"):
        return (
            'Sub-questions:\n```json\n["Which harbours exist?", "How did Velmar grow?", "Which harbours exist?"]\n```'
        )
    if body.get("stream"):
        return f"Answer using: {body['messages'][0]['content'].count('Harbour report')} sources"
    return _evaluation_double(body)


@answering
def test_it_searches_with_the_embedding_of_a_hypothetical_passage_for_hyde(harbour, openai_double):
    openai_double.reply(_baselines_double)

    call_command("evaluate", workspace="acme", set_name="harbour", a="hyde", b="naive")

    run = EvaluationRun.objects.get()
    embedded = [request.body["input"] for request in openai_double.embedding_requests()]
    assert ["Velmar's harbour overtook Ostrand in 1990."] in embedded
    hyde = run.answers.filter(system="hyde").select_related("question").first()
    assert hyde.retrieval_stats["hyde_passage"] == "Velmar's harbour overtook Ostrand in 1990."
    assert hyde.text == "Answer using: 1 sources"
    # the passage, its embedding, the answer
    assert hyde.llm_calls == 3
    answer_request = next(
        r for r in openai_double.chat_requests() if r.body.get("stream") and hyde.question.text in r.last_user_message
    )
    assert answer_request.last_user_message == hyde.question.text


@answering
def test_it_retrieves_each_sub_question_once_and_merges_their_sources_for_rqrag(harbour, openai_double):
    openai_double.reply(_baselines_double)

    call_command("evaluate", workspace="acme", set_name="harbour", a="rqrag", b="naive")

    rqrag = EvaluationRun.objects.get().answers.filter(system="rqrag").first()
    assert rqrag.retrieval_stats["sub_questions"] == ["Which harbours exist?", "How did Velmar grow?"]
    # one source chunk found by both sub-questions appears once
    assert rqrag.retrieval_stats["sources"] == 1
    assert rqrag.text == "Answer using: 1 sources"
    # the decomposition, one embedding request per sub-question, the answer
    assert rqrag.llm_calls == 4


def test_it_falls_back_to_the_question_when_the_decomposition_holds_no_list():
    assert sub_questions("I can't split this.", question="Why?") == ["Why?"]
    assert sub_questions('["a?", "b?", "c?", "d?", "e?"]', question="Why?") == ["a?", "b?", "c?", "d?"]
