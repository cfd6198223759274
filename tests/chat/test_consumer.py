import asyncio
import re
import threading

import pytest
from channels.db import database_sync_to_async
from django.db import connections
from django.db.backends.utils import CursorWrapper

from chat import consumers
from chat.models import Conversation, Message
from knowledge.models import Membership, Role
from knowledge.rag import llm
from knowledge.services import asking
from tests.chat.conftest import ANSWER, HANDBOOK
from tests.chat.sockets import TIMEOUT, ask, ask_as_page, events_until, open_socket
from tests.factories import make_document, make_user, make_workspace

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
async def close_worker_connections():
    """The consumer's ORM calls run on asgiref's worker thread; its connection must close
    before the test database can be flushed and dropped."""
    yield
    await database_sync_to_async(connections.close_all)()


@database_sync_to_async
def saved_messages() -> list[Message]:
    return list(Message.objects.select_related("conversation").order_by("created_at", "id"))


@pytest.fixture
def every_query(monkeypatch) -> list[str]:
    """The SQL of every connection, whichever thread runs it: retrieval uses several."""
    statements, lock = [], threading.Lock()
    execute = CursorWrapper._execute_with_wrappers

    def recording(self, sql, params, many, executor):
        with lock:
            statements.append(sql)
        return execute(self, sql, params, many, executor)

    monkeypatch.setattr(CursorWrapper, "_execute_with_wrappers", recording)
    return statements


def chat_tasks() -> list[asyncio.Task]:
    return [task for task in asyncio.all_tasks() if task.get_name().startswith("chat-answer-") and not task.done()]


async def test_it_closes_the_socket_of_an_anonymous_visitor_with_4401(handbook_workspace):
    communicator = await open_socket(None)

    closed = await communicator.receive_output(timeout=TIMEOUT)

    assert closed == {"type": "websocket.close", "code": 4401}


@pytest.mark.parametrize("slug", ["acme", "no-such-workspace"])
async def test_it_closes_the_socket_of_a_non_member_with_4403(handbook_workspace, outsider, slug):
    communicator = await open_socket(outsider, slug=slug)

    closed = await communicator.receive_output(timeout=TIMEOUT)

    assert closed == {"type": "websocket.close", "code": 4403}


async def test_it_streams_retrieval_then_tokens_then_done_to_a_viewer(handbook_workspace, viewer, chat_model):
    communicator = await open_socket(viewer)

    events = await ask(communicator, mode="local")

    types = [event["type"] for event in events]
    assert types[0] == "retrieval"
    assert types[-1] == "done"
    assert set(types[1:-1]) == {"token"}
    assert len(types) > 5
    retrieval, done = events[0], events[-1]
    labels = {node["label"] for node in retrieval["subgraph"]["nodes"]}
    assert {"Ada Lovelace", "Analytical Engine"} <= labels
    assert all(node["description"] for node in retrieval["subgraph"]["nodes"])
    assert any(citation["document_title"] == "Handbook" for citation in retrieval["citations"])
    assert "Ada Lovelace" in retrieval["keywords"]["low_level"]
    streamed = "".join(event["text"] for event in events if event["type"] == "token")
    assert streamed == ANSWER
    assert "<strong>first published algorithm</strong>" in done["html"]
    assert 'data-cite="S1"' in done["html"]
    assert done["usage"]["calls"] == 2  # one keyword call, one answer
    [question, answer] = await saved_messages()
    assert (question.role, question.content) == ("user", "Who wrote the first algorithm for the Analytical Engine?")
    assert answer.pk == done["message"]
    assert answer.content == streamed
    assert (answer.mode, answer.stopped, answer.extractive) == ("local", False, False)
    assert answer.subgraph == retrieval["subgraph"]
    assert [citation["id"] for citation in answer.citations] == [citation["id"] for citation in retrieval["citations"]]
    assert answer.citations == done["citations"]
    cited = {citation["id"]: citation for citation in done["citations"]}
    # The answer cites S1 for "wrote the first published algorithm": that sentence, with its span.
    assert cited["S1"]["sentence"] == (
        "She wrote the first published algorithm for the machine, and Babbage designed its mill and store."
    )
    assert HANDBOOK[cited["S1"]["sentence_start"] : cited["S1"]["sentence_end"]] == cited["S1"]["sentence"]
    assert retrieval["citations"][0]["sentence"] is None
    assert answer.keywords["low_level"] == retrieval["keywords"]["low_level"]
    assert answer.usage["completion_tokens"] > 0
    assert answer.conversation.user_id == viewer.pk
    assert answer.conversation.title == "Who wrote the first algorithm for the Analytical Engine?"
    assert done["conversation"] == answer.conversation.pk
    await communicator.disconnect()


async def test_it_continues_a_conversation_with_its_history(handbook_workspace, viewer, chat_model):
    communicator = await open_socket(viewer)
    first = await ask(communicator)
    conversation = first[-1]["conversation"]
    chat_model.script.answer = "Charles Babbage [E2]."

    second = await ask(communicator, question="And who designed its mill?", conversation=conversation)

    assert second[-1]["type"] == "done"
    assert second[-1]["conversation"] == conversation
    streamed = chat_model.chat_requests()[-1]
    contents = [message["content"] for message in streamed.messages]
    assert "Who wrote the first algorithm for the Analytical Engine?" in contents
    assert ANSWER in contents
    assert await database_sync_to_async(Message.objects.filter(conversation_id=conversation).count)() == 4
    # The follow-up's keywords were found with the turn it points back to; a new topic's are not.
    third = await ask(communicator, question="Who was Charles Babbage?", conversation=conversation)
    assert third[-1]["type"] == "done"
    keyword_requests = [request for request in chat_model.chat_requests() if not request.body.get("stream")]
    assert [
        "Who wrote the first algorithm for the Analytical Engine?" in request.last_user_message
        for request in keyword_requests
    ] == [True, True, False]
    await communicator.disconnect()


async def test_a_scoped_question_reads_only_its_scope_and_its_conversation_remembers_it(
    handbook_workspace, viewer, chat_model
):
    communicator = await open_socket(viewer)

    events = await ask(communicator, mode="naive", filters={"tags": ["Elsewhere"], "documents": []})

    assert events[-1]["type"] == "done"
    assert events[0]["citations"] == []
    conversation = await database_sync_to_async(Conversation.objects.get)(pk=events[-1]["conversation"])
    assert conversation.scope == {"tags": ["elsewhere"], "documents": []}
    everything = await ask(communicator, mode="naive", conversation=conversation.pk, filters={})
    assert everything[0]["citations"]
    await database_sync_to_async(conversation.refresh_from_db)()
    assert conversation.scope == {}
    await communicator.disconnect()


async def test_it_refuses_to_continue_another_users_private_conversation(handbook_workspace, owner, viewer, chat_model):
    private = await database_sync_to_async(Conversation.objects.create)(workspace=handbook_workspace, user=owner)
    communicator = await open_socket(viewer)

    [error] = await ask(communicator, conversation=private.pk)

    assert error["type"] == "error"
    assert "not shared with you" in error["message"]
    assert await saved_messages() == []
    private.shared = True
    await database_sync_to_async(private.save)()
    events = await ask(communicator, conversation=private.pk)
    assert events[-1]["type"] == "done"
    assert events[-1]["conversation"] == private.pk
    await communicator.disconnect()


async def test_it_refuses_a_second_question_while_answering(handbook_workspace, viewer, chat_model):
    chat_model.token_delay = 0.05
    communicator = await open_socket(viewer)
    await communicator.send_json_to({"type": "ask", "question": "Who was Ada Lovelace?"})
    assert (await communicator.receive_json_from(timeout=TIMEOUT))["type"] == "retrieval"

    await communicator.send_json_to({"type": "ask", "question": "Who was Charles Babbage?"})
    events = await events_until(communicator, "error", "done")

    assert events[-1]["type"] == "error"
    assert "Still answering" in events[-1]["message"]
    rest = await events_until(communicator, "done")
    assert "".join(event.get("text", "") for event in events + rest) == ANSWER
    assert [message.content for message in await saved_messages()] == ["Who was Ada Lovelace?", ANSWER]
    await communicator.disconnect()


async def test_it_stops_on_cancel_and_saves_the_partial_answer_marked_stopped(handbook_workspace, viewer, chat_model):
    chat_model.script.answer = " ".join(f"word{n}" for n in range(200))
    chat_model.token_delay = 0.02
    communicator = await open_socket(viewer)
    await communicator.send_json_to({"type": "ask", "question": "Tell me everything about the engine."})
    events = [await communicator.receive_json_from(timeout=TIMEOUT) for _ in range(4)]
    assert [event["type"] for event in events] == ["retrieval", "token", "token", "token"]

    await communicator.send_json_to({"type": "cancel"})
    events += await events_until(communicator, "done")

    done = events[-1]
    assert done["stopped"] is True
    streamed = "".join(event["text"] for event in events if event["type"] == "token")
    assert 0 < len(streamed) < len(chat_model.script.answer)
    answer = (await saved_messages())[-1]
    assert (answer.pk, answer.content, answer.stopped) == (done["message"], streamed, True)
    assert chat_tasks() == []
    # The socket keeps working after a stop.
    chat_model.token_delay = 0
    chat_model.script.answer = ANSWER
    assert (await ask(communicator))[-1]["type"] == "done"
    await communicator.disconnect()


async def test_it_reports_a_failing_model_and_stays_usable(handbook_workspace, viewer, chat_model, settings):
    settings.LLM_MAX_RETRIES = 1
    communicator = await open_socket(viewer)
    chat_model.fail(2, status=500)

    [error] = await ask(communicator)

    assert error["type"] == "error"
    # A viewer learns what to do, never where the model lives or what it said.
    assert error["message"] == (
        "The chat model did not answer; try again later. If it keeps failing, an owner should check LLM settings."
    )
    assert (await ask(communicator))[-1]["type"] == "done"
    # Now the keywords are cached, so the failure hits the streamed answer itself.
    chat_model.fail(2, status=503)
    events = await ask(communicator)
    assert [event["type"] for event in events] == ["retrieval", "error"]
    assert "an owner should check LLM settings" in events[-1]["message"]
    assert "503" not in events[-1]["message"]
    assert "127.0.0.1" not in events[-1]["message"]
    assert (await ask(communicator))[-1]["type"] == "done"
    answers = [m for m in await saved_messages() if m.role == "assistant"]
    assert [answer.content for answer in answers] == [ANSWER, ANSWER]
    await communicator.disconnect()


async def test_it_tells_an_owner_what_the_failing_model_said_without_its_key(
    handbook_workspace, owner, chat_model, settings
):
    settings.LLM_MAX_RETRIES = 0
    settings.LLM_API_KEY = "sk-live-secret-key-123456"
    communicator = await open_socket(owner)
    chat_model.fail(1, status=401, message="Incorrect API key provided: sk-live-secret-key-123456")

    [error] = await ask(communicator)

    assert "refused the API key (401)" in error["message"]
    assert "127.0.0.1" in error["message"]
    assert "sk-live" not in error["message"]
    await communicator.disconnect()


async def test_it_cancels_the_model_stream_when_the_socket_closes(handbook_workspace, viewer, chat_model):
    chat_model.script.answer = " ".join(f"word{n}" for n in range(300))
    chat_model.token_delay = 0.02
    communicator = await open_socket(viewer)
    await communicator.send_json_to({"type": "ask", "question": "Tell me everything about the engine."})
    for expected in ("retrieval", "token", "token"):
        assert (await communicator.receive_json_from(timeout=TIMEOUT))["type"] == expected
    assert len(chat_tasks()) == 1

    await communicator.disconnect()

    assert chat_tasks() == []
    for _ in range(100):
        if chat_model.streams_closed_early:
            break
        await asyncio.sleep(0.05)
    assert chat_model.streams_closed_early == 1
    answer = (await saved_messages())[-1]
    assert answer.stopped
    assert answer.content.startswith("word0 word1")
    assert len(answer.content) < len(chat_model.script.answer)


async def test_it_explains_bad_messages_and_keeps_the_socket(handbook_workspace, viewer, chat_model):
    communicator = await open_socket(viewer)

    [empty] = await ask(communicator, question="   ")
    [mode] = await ask(communicator, mode="psychic")
    [top_k] = await ask(communicator, top_k=0)
    await communicator.send_to(text_data="not json")
    [garbage] = await events_until(communicator, "error")
    await communicator.send_json_to({"type": "shout"})
    [unknown] = await events_until(communicator, "error")

    assert empty["message"] == "'question' is required: the text to ask."
    assert mode["message"] == "Unknown mode 'psychic': use one of mix, hybrid, local, global, naive, bypass."
    assert "top_k" in top_k["message"]
    assert "JSON" in garbage["message"]
    assert "ask" in unknown["message"]
    assert await saved_messages() == []
    assert (await ask(communicator))[-1]["type"] == "done"
    await communicator.disconnect()


async def test_it_says_when_the_workspace_has_no_documents_yet(viewer, chat_model):
    await database_sync_to_async(make_workspace)(slug="empty", members={viewer: Role.VIEWER})
    communicator = await open_socket(viewer, slug="empty")

    [error] = await ask(communicator)

    assert error["type"] == "error"
    assert "no documents yet" in error["message"]
    assert await database_sync_to_async(Conversation.objects.count)() == 0
    await communicator.disconnect()


async def test_it_says_when_documents_are_still_being_processed(viewer, chat_model):
    @database_sync_to_async
    def workspace_with_pending_document():
        workspace = make_workspace(slug="busy", members={viewer: Role.VIEWER})
        document = make_document(workspace, title="Pending")
        document.status = document.Status.PROCESSING
        document.save()

    await workspace_with_pending_document()
    communicator = await open_socket(viewer, slug="busy")

    [error] = await ask(communicator)

    assert "still being processed" in error["message"]
    await communicator.disconnect()


async def test_it_renders_markup_in_model_output_inert(handbook_workspace, viewer, chat_model):
    chat_model.script.answer = (
        "<script>alert(1)</script> [click](javascript:alert(1)) <img src=x onerror=alert(1)> "
        '[ok](https://example.com "t") <a href="javascript:alert(2)">a</a>'
    )
    communicator = await open_socket(viewer)

    events = await ask(communicator)

    html = events[-1]["html"]
    assert "<script" not in html
    assert "<img" not in html
    assert re.findall(r'<a [^>]*href="([^"]*)"', html) == ["https://example.com"]
    assert "&lt;script&gt;" in html
    answer = (await saved_messages())[-1]
    assert answer.content == chat_model.script.answer  # stored as streamed; rendered safe on output
    await communicator.disconnect()


async def test_it_answers_extractively_when_no_chat_model_is_configured(handbook_workspace, viewer, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    communicator = await open_socket(viewer)

    events = await ask(communicator)

    assert events[0]["type"] == "retrieval"
    done = events[-1]
    assert done["type"] == "done"
    assert done["extractive"] is True
    streamed = "".join(event["text"] for event in events if event["type"] == "token")
    assert streamed.endswith(
        "- Ada Lovelace worked with Charles Babbage on the Analytical Engine. "
        "She wrote the first published algorithm for the machine, and Babbage designed its mill and store. [S1]"
    )
    [source] = [citation for citation in done["citations"] if citation["id"] == "S1"]
    assert HANDBOOK[source["sentence_start"] : source["sentence_end"]] == source["sentence"]
    assert source["sentence"].startswith("She wrote the first published algorithm")
    answer = (await saved_messages())[-1]
    assert answer.extractive
    assert answer.content == streamed
    assert answer.citations == done["citations"]
    await communicator.disconnect()


async def test_it_answers_bypass_questions_without_documents(viewer, chat_model):
    await database_sync_to_async(make_workspace)(slug="empty", members={viewer: Role.VIEWER})
    chat_model.script.answer = "Hello there."
    communicator = await open_socket(viewer, slug="empty")

    events = await ask(communicator, question="Say hello", mode="bypass")

    assert events[0]["subgraph"] == {"nodes": [], "edges": []}
    assert events[-1]["type"] == "done"
    assert (await saved_messages())[-1].content == "Hello there."
    await communicator.disconnect()


async def test_it_keeps_members_of_one_workspace_out_of_another(handbook_workspace, viewer, chat_model):
    other_owner = await database_sync_to_async(make_user)("stranger")
    await database_sync_to_async(make_workspace)(slug="secret", members={other_owner: Role.OWNER})

    communicator = await open_socket(viewer, slug="secret")

    assert await communicator.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4403}


async def test_an_answer_costs_its_retrieval_and_ten_queries_of_bookkeeping(
    handbook_workspace, viewer, chat_model, every_query
):
    communicator = await open_socket(viewer)
    # The socket is accepted before connect() looks the workspace up; a first reply means that
    # lookup is done, so it is not counted against the answer.
    await communicator.send_json_to({"type": "ping"})
    await communicator.receive_json_from(timeout=TIMEOUT)
    # The Models page's picks are read once per process and change, not per answer.
    await database_sync_to_async(llm.current_config)()
    every_query.clear()

    events = await ask(communicator, mode="local")

    assert events[-1]["type"] == "done"
    # Retrieval: the keyword cache read and write, the entity search, its one-hop relations, the
    # walk's edges, provenance, the subgraph's edges. The subgraph's descriptions came with them.
    assert events[0]["sql_queries"] == 7
    # The gate (membership, documents), the question (a conversation, its title and time, the
    # message), the answer, and the record of the question (started, completed, tied to the answer).
    assert len(every_query) == 7 + 2 + 4 + 1 + 3
    await communicator.disconnect()


async def test_it_refuses_the_next_question_of_a_member_removed_meanwhile_and_closes_with_4403(
    handbook_workspace, viewer, chat_model
):
    communicator = await open_socket(viewer)
    assert (await ask(communicator))[-1]["type"] == "done"
    await database_sync_to_async(Membership.objects.filter(user=viewer).delete)()

    [error] = await ask(communicator, question="And who built it?")

    assert error == {"type": "error", "message": "No such workspace, or you are not a member of it."}
    assert await communicator.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4403}
    assert [message.role for message in await saved_messages()] == ["user", "assistant"]


async def test_a_slow_retrieval_holds_up_no_other_socket(handbook_workspace, owner, viewer, chat_model, monkeypatch):
    entered, release, released = threading.Event(), threading.Event(), threading.Event()
    retrieve = asking.retrieve

    def slow_the_first(**arguments):
        if not entered.is_set():
            entered.set()
            # Longer than the second socket may take, so only this test's release ends the wait.
            release.wait(timeout=3 * TIMEOUT)
            released.set()
        return retrieve(**arguments)

    monkeypatch.setattr(asking, "retrieve", slow_the_first)
    first = await open_socket(viewer)
    await first.send_json_to({"type": "ask", "question": "Who was Ada Lovelace?"})
    try:
        assert await asyncio.to_thread(entered.wait, TIMEOUT)
        # Logging in, the membership check and saving the question all run on asgiref's shared
        # thread; a retrieval running there would hold this socket up until it ended.
        second = await open_socket(owner)
        assert (await ask(second))[-1]["type"] == "done"
        assert not released.is_set()
    finally:
        release.set()
    assert (await events_until(first, "done"))[-1]["type"] == "done"
    await first.disconnect()
    await second.disconnect()


async def test_it_refuses_questions_past_the_limit_with_an_error_saying_when_to_retry(
    handbook_workspace, viewer, chat_model, settings, ten_seconds_into_an_hour
):
    settings.RATE_LIMIT_ASK = (1, 3600)
    communicator = await open_socket(viewer)
    assert (await ask(communicator))[-1]["type"] == "done"

    [error] = await ask(communicator, question="And who built it?")

    assert error["type"] == "error"
    assert error["message"].startswith("Too many questions for now; try again in ")
    assert error["retry_after"] == 3590
    # The socket stays open, and the refused question was not saved.
    assert [message.role for message in await saved_messages()] == ["user", "assistant"]
    await communicator.disconnect()


async def test_a_turn_cites_and_renders_its_answer_once(handbook_workspace, viewer, chat_model, monkeypatch):
    from chat import rendering, services

    calls = []

    def counting(name, function):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(asking, "answer_citations", counting("cite", asking.answer_citations))
    monkeypatch.setattr(rendering, "render_answer", counting("render", rendering.render_answer))
    for module in (services, consumers):
        for name, label in (("answer_citations", "cite"), ("render_answer", "render")):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, counting(label, getattr(module, name)))
    communicator = await open_socket(viewer)

    frames = await ask_as_page(communicator)

    done = frames[-1]
    assert sorted(calls) == ["cite", "render"]
    assert 'data-cite="S1"' in done["html"]
    assert any(done["html"] in frame for frame in frames if isinstance(frame, str))
    assert done["citations"][0]["sentence"]
    await communicator.disconnect()


async def test_it_sends_the_page_its_partials_between_the_events(handbook_workspace, viewer, chat_model):
    communicator = await open_socket(viewer)

    frames = await ask_as_page(communicator, mode="local", top_k="7", chunk_top_k="3", conversation="")

    kinds = [frame["type"] if isinstance(frame, dict) else "html" for frame in frames]
    assert kinds[:3] == ["html", "html", "retrieval"]
    assert kinds[-3:] == ["html", "html", "done"]
    turn, retrieved, answer, sources = frames[0], frames[1], frames[-3], frames[-2]
    conversation = frames[-1]["conversation"]
    # The question and its open answer, the form pointed at the new conversation, its title shown.
    assert 'hx-swap-oob="beforeend:#messages"' in turn
    assert "Who wrote the first algorithm for the Analytical Engine?</div>" in turn
    assert 'id="answer-live"' in turn
    assert f'id="ask-conversation" name="conversation" value="{conversation}"' in turn
    assert 'id="conversation-header"' in turn
    # Everything retrieved, nothing cited yet; then the answer as a reload shows it, and what it cites.
    assert 'id="sources" ' in retrieved
    assert 'id="cite-S1"' in retrieved
    assert 'hx-swap-oob="outerHTML:#answer-live"' in answer
    assert "<strong>first published algorithm</strong>" in answer
    assert f'hx-get="/workspaces/acme/chat/answers/{frames[-1]["message"]}/feedback/"' in answer
    assert '<li class="cited-item kind-source" id="cite-S1"' in sources
    [question, saved] = await saved_messages()
    assert (saved.mode, question.content) == ("local", "Who wrote the first algorithm for the Analytical Engine?")
    retrieval = frames[2]
    assert len([c for c in retrieval["citations"] if c["kind"] == "entity"]) <= 7

    follow_up = await ask_as_page(communicator, question="And its mill?", conversation=str(conversation))

    assert 'id="conversation-header"' not in follow_up[0]
    assert follow_up[-1]["conversation"] == conversation
    await communicator.disconnect()


async def test_it_explains_a_bad_setting_from_the_page_and_saves_nothing(handbook_workspace, viewer, chat_model):
    communicator = await open_socket(viewer)

    frames = await ask_as_page(communicator, top_k="0")

    assert frames == [{"type": "error", "message": "top_k must be between 1 and 200."}]
    assert await saved_messages() == []
    await communicator.disconnect()
