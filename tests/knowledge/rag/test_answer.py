import re
from dataclasses import replace

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from markdown_it import MarkdownIt

from knowledge.models import LLMCacheEntry
from knowledge.rag import llm
from knowledge.rag.answer import answer_is_extractive, astream_answer
from knowledge.rag.answer.citations import answer_citations
from knowledge.rag.answer.extractive import NO_CONTEXT_ANSWER, _blocks, extractive_answer
from knowledge.rag.chunking import chunk_text
from knowledge.rag.llm import LLMError, Usage
from knowledge.rag.parsing import parse_file
from knowledge.rag.retrieval import ChunkRow, RetrievalResult, nlp_keywords, retrieve
from knowledge.rag.retrieval.context import build_citations
from knowledge.rag.retrieval.keywords import _nlp_keywords_in_context
from tests.knowledge.documents import HTML_PAGE, MARKDOWN_GUIDE, PDF_TEXT
from tests.knowledge.rag.test_sentences import readable
from tests.knowledge.team_graph import ask, build_team_graph

HISTORY = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n}"} for n in range(8)]


@pytest.fixture
def graph(workspace):
    return build_team_graph(workspace)


@pytest.fixture
def no_chat_model(settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""


async def collect(stream) -> list[str]:
    return [piece async for piece in stream]


@pytest.mark.django_db(transaction=True)
async def test_it_streams_the_models_cited_answer_from_the_context(graph, workspace, openai_double):
    openai_double.reply("Bob works with Carol [R1] and pairs with Erin [S3].")
    result = await _ask(workspace, "mix")
    usage = Usage()

    pieces = await collect(
        astream_answer(
            question="Who works with whom?",
            result=result,
            history=HISTORY,
            response_type="Bullet Points",
            usage=usage,
        )
    )

    assert "".join(pieces) == "Bob works with Carol [R1] and pairs with Erin [S3]."
    assert len(pieces) > 1
    (request,) = openai_double.chat_requests()
    system, *turns, question = request.messages
    assert result.context in system["content"]
    assert "[E3]" in system["content"]
    assert "does not contain the answer" in system["content"]
    assert "Bullet Points" in system["content"]
    assert [turn["content"] for turn in turns] == [f"turn {n}" for n in range(2, 8)]
    assert question == {"role": "user", "content": "Who works with whom?"}
    assert usage.completion_tokens > 0
    assert usage.calls == 1


@pytest.mark.django_db(transaction=True)
async def test_it_raises_a_readable_error_when_the_model_fails(graph, workspace, openai_double, settings):
    settings.LLM_MAX_RETRIES = 1
    openai_double.fail(5, status=500)
    result = await _ask(workspace, "local")

    with pytest.raises(LLMError, match=r"\S"):
        await collect(astream_answer(question="Who works with whom?", result=result))


@pytest.mark.django_db(transaction=True)
async def test_it_asks_the_model_without_context_in_bypass_mode(workspace, openai_double):
    openai_double.reply("Hello.")
    result = await _ask(workspace, "bypass")

    assert "".join(await collect(astream_answer(question="Say hello", result=result))) == "Hello."
    (request,) = openai_double.chat_requests()
    assert "---Context---" not in request.messages[0]["content"]


def test_it_answers_extractively_from_the_best_supported_sentences(graph, workspace, no_chat_model):
    result = ask(workspace, "local")

    pieces = _collect_sync(astream_answer(question="Did Bob meet Carol?", result=result))
    answer = "".join(pieces)

    assert answer_is_extractive()
    assert not answer.startswith("_")  # the page says once that answers are extractive
    assert len(pieces) > 1
    lines = [line for line in answer.splitlines() if line.startswith("- ")]
    assert lines[0] == "- Alice, Bob and Carol met Dave. [S1]"
    cited = set(re.findall(r"\[(S\d+)\]", answer))
    assert cited <= {row.id for row in result.chunks}
    assert {row.id: row.text for row in result.chunks}["S1"] == "Alice, Bob and Carol met Dave."


def test_it_says_so_when_nothing_was_retrieved(workspace, no_chat_model):
    result = ask(workspace, "mix")

    answer = "".join(_collect_sync(astream_answer(question="Who works with whom?", result=result)))

    assert result.context == ""
    assert answer == NO_CONTEXT_ANSWER


@pytest.mark.django_db(transaction=True)
async def test_it_does_not_call_the_model_when_nothing_was_retrieved(workspace, openai_double):
    result = await _ask(workspace, "local")

    answer = "".join(await collect(astream_answer(question="Who works with whom?", result=result)))

    assert answer == NO_CONTEXT_ANSWER
    assert openai_double.chat_requests() == []


def test_it_extracts_keywords_with_one_cached_model_call(graph, workspace, openai_double):
    openai_double.reply(
        'Here they are:\n```json\n{"high_level_keywords": ["teamwork"], "low_level_keywords": ["Bob"]}\n```'
    )
    history = [{"role": "user", "content": "Tell me about Bob."}, {"role": "assistant", "content": "Bob is here."}]

    first = retrieve(workspace=workspace, question="Who does he work with?", mode="local", history=history)
    second = retrieve(workspace=workspace, question="Who does he work with?", mode="local", history=history)

    assert first.keywords.high_level == ("teamwork",)
    assert first.keywords.low_level == ("Bob",)
    assert first.keywords.source == "llm"
    assert second.keywords == first.keywords
    (request,) = openai_double.chat_requests()
    assert "Tell me about Bob." in request.last_user_message
    assert LLMCacheEntry.objects.filter(kind="keywords").count() == 1
    assert len(openai_double.embedding_requests()) == 2


def test_it_falls_back_to_nlp_keywords_when_the_reply_has_no_json(graph, workspace, openai_double):
    openai_double.reply("I am not sure what you mean.")

    result = retrieve(workspace=workspace, question="What does Alice Smith do?", mode="local")

    assert result.keywords.source == "nlp"
    assert result.keywords.low_level == ("Alice Smith",)


def test_it_skips_the_keyword_call_when_keywords_are_given(graph, workspace, openai_double):
    result = retrieve(
        workspace=workspace,
        question="Who works with whom?",
        mode="hybrid",
        keywords={"high_level": ["teamwork"], "low_level": ["Bob"]},
    )

    assert result.keywords.source == "given"
    assert openai_double.chat_requests() == []
    # One batch: the keywords for the graph searches, the question to pick the graph's chunks.
    (request,) = openai_double.embedding_requests()
    assert request.body["input"] == ["Bob", "teamwork", "Who works with whom?"]


async def _ask(workspace, mode):
    def ask_and_disconnect():
        # The executor thread's connection would otherwise outlive the test database.
        try:
            return ask(workspace, mode)
        finally:
            connection.close()

    return await sync_to_async(ask_and_disconnect)()


def _collect_sync(stream) -> list[str]:
    return async_to_sync(collect)(stream)


# ---------------------------------------------------------------------------------------
# Extractive answers and cited sentences on real-looking documents

DOCUMENTS = {
    "frobnicator.md": MARKDOWN_GUIDE,
    "Debian package management": parse_file("page.html", HTML_PAGE.encode()).text,
    "lightrag.pdf": PDF_TEXT,
}
QUESTIONS = [
    "Who developed LightRAG?",
    "How does dpkg differ from apt?",
    "What does the installer do?",
    "Where is the Frobnicator configuration stored?",
    "What is Debian?",
    "How does LightRAG extract entities?",
    "Which command removes a package?",
]


def sources_for(question: str, *, chunk_tokens: int = 200) -> RetrievalResult:
    """Every chunk of the documents as a source row, with offsets as ingestion stores them."""
    rows = []
    for document_id, (title, text) in enumerate(DOCUMENTS.items(), 1):
        for span in chunk_text(text, size=chunk_tokens, overlap=20):
            rows.append(
                ChunkRow(
                    id=f"S{len(rows) + 1}",
                    chunk_id=len(rows) + 1,
                    document_id=document_id,
                    document_title=title,
                    text=span.text,
                    token_count=span.token_count,
                    char_start=span.char_start,
                    char_end=span.char_end,
                    support=0,
                    found_by="vector",
                )
            )
    result = RetrievalResult(mode="naive", question=question, keywords=nlp_keywords(question), chunks=rows)
    result.citations = build_citations(result, [])
    return result


def answer_lines(answer: str) -> list[str]:
    return answer.strip().splitlines()


def document_text(result: RetrievalResult, row_id: str) -> str:
    row = next(row for row in result.chunks if row.id == row_id)
    return list(DOCUMENTS.values())[row.document_id - 1]


@pytest.mark.parametrize("question", QUESTIONS)
def test_extractive_answers_contain_no_markdown_structure_or_duplicates(question):
    result = sources_for(question)

    answer = extractive_answer(question, result)

    blocks = {token.type for token in MarkdownIt("commonmark").enable("table").parse(answer) if token.block}
    assert blocks <= {"paragraph_open", "paragraph_close", "inline", "bullet_list_open", "bullet_list_close"} | {
        "list_item_open",
        "list_item_close",
    }
    lines = answer_lines(answer)
    assert 1 <= len(lines) <= 8
    said = [re.sub(r" \[S\d+\]$", "", line.removeprefix("- ")) for line in lines]
    assert len(set(said)) == len(said)
    for line, text in zip(lines, said, strict=True):
        assert re.fullmatch(r"- [A-Z0-9`].*[.!?`)] \[S\d+\]", line), line
        assert not re.search(r"^#|\n|\|| - |^\d+\.", text), text
        row_id = line.rsplit("[", 1)[1].rstrip("]")
        source = " ".join(re.sub(r"-\n(?=[a-z])", "", document_text(result, row_id)).split())
        assert text in source


@pytest.mark.parametrize(
    ("question", "parts"),
    [
        (
            "Who maintains Frobnicator and which format does its configuration use?",
            ["maintained by Dana Whitfield", "The file uses the INI format"],
        ),
        (
            "Where is package configuration stored and what does dpkg install?",
            ["Package configuration is stored in /etc/apt", "The dpkg command installs a local package file"],
        ),
    ],
)
def test_a_two_part_question_gets_sentences_for_both_parts(question, parts):
    lines = answer_lines(extractive_answer(question, sources_for(question)))

    for part in parts:
        assert any(part in line for line in lines), part


def test_it_keeps_only_sentences_that_add_to_the_answer():
    one_fact = "What does the incremental update algorithm do?"
    broad = "What is Debian?"

    assert answer_lines(extractive_answer(one_fact, sources_for(one_fact))) == [
        "- The incremental update algorithm processes new documents with the same graph-based indexing steps as "
        "before, and then merges the new graph with the original one. [S7]"
    ]
    # Every other sentence naming Debian would only repeat what the question asked: no padding.
    assert answer_lines(extractive_answer(broad, sources_for(broad))) == [
        "- Debian is a volunteer organization which builds consistent distributions of pre-compiled binary "
        "packages of free software and distributes them from its archive. [S3]"
    ]


def test_a_sentence_that_begins_with_a_pronoun_comes_with_the_sentence_it_refers_to():
    question = "Who maintains Frobnicator?"

    lines = answer_lines(extractive_answer(question, sources_for(question)))

    assert lines[0] == (
        "- Frobnicator is a command-line tool for frobnicating large files. It was written by the Acme tools team "
        "in 2019 and is maintained by Dana Whitfield. [S1]"
    )


@pytest.mark.parametrize("question", QUESTIONS)
def test_it_cites_the_exact_span_of_each_sentence_of_an_extractive_answer(question):
    result = sources_for(question)
    answer = extractive_answer(question, result)

    citations = answer_citations(answer, result)

    cited = [citation for citation in citations if citation["sentences"]]
    assert {citation["id"] for citation in cited} == set(re.findall(r"\[(S\d+)\]", answer))
    rows = {row.id: row for row in result.chunks}
    for citation in cited:
        text = document_text(result, citation["id"])
        assert (citation["sentence"], citation["sentence_start"], citation["sentence_end"]) == tuple(
            citation["sentences"][0].values()
        )
        for sentence in citation["sentences"]:
            assert readable(text[sentence["start"] : sentence["end"]]) == sentence["text"]
            assert (
                rows[citation["id"]].char_start <= sentence["start"] < sentence["end"] <= rows[citation["id"]].char_end
            )
            assert f"{sentence['text']} [{citation['id']}]" in answer
    assert all(citation["sentence"] is None for citation in citations if not citation["sentences"])


def test_it_points_a_models_citation_at_the_sentence_that_supports_it():
    result = sources_for("Where does Frobnicator keep its settings?")
    row = next(row for row in result.chunks if "~/.frobrc" in row.text)
    assert row.id != "S1"
    # A marker inside the sentence, and one after its full stop.
    answer = f"Frobnicator reads its settings from `~/.frobrc` [{row.id}]. Dana Whitfield maintains it. [S1]"

    cited = {citation["id"]: citation for citation in answer_citations(answer, result)}

    assert cited[row.id]["sentence"] == "Frobnicator reads its configuration from `~/.frobrc`."
    assert cited["S1"]["sentence"] == (
        "It was written by the Acme tools team in 2019 and is maintained by Dana Whitfield."
    )
    start, end = cited["S1"]["sentence_start"], cited["S1"]["sentence_end"]
    assert readable(MARKDOWN_GUIDE[start:end]) == cited["S1"]["sentence"]
    assert [citation["sentence"] for row_id, citation in cited.items() if row_id not in {"S1", row.id}] == [None] * (
        len(cited) - 2
    )


def test_answers_found_on_several_threads_at_once_stem_their_words_alike():
    # Citations are found on pool threads, one per answer; a stemmer shared between them mixed
    # up their words (an IndexError under 50 simultaneous askers).
    from concurrent.futures import ThreadPoolExecutor

    from knowledge.rag.answer.reading import content_terms

    texts = [f"The engineers were designing {n} calculating engines and publishing algorithms" for n in range(400)]
    alone = [content_terms(text) for text in texts]

    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(content_terms, texts))

    assert together == alone


LOGGING_HOWTO = """\
Logging HOWTO

Logging levels

The numeric values of logging levels are given in the following table. These are primarily of \
interest if you want to define your own levels, and need them to have specific values relative to \
the predefined levels.

Level | Numeric value
CRITICAL | 50
ERROR | 40
WARNING | 30
INFO | 20
DEBUG | 10
NOTSET | 0

Levels can also be associated with loggers, being set either by the developer or through loading a \
saved logging configuration. When a logging method is called on a logger, the logger compares its \
own level with the level associated with the method call.
"""
HANDLERS = """\
Logging handlers

Handler objects are responsible for dispatching the appropriate log messages to the handler's \
specified destination. Logger objects can add zero or more handler objects to themselves. The \
standard library includes quite a few handler types. A handler has its own level, which is \
compared with the level of each record it receives.
"""
LIGHTRAG = """\
LightRAG

In the retrieval phase, GraphRAG generates 1,399 communities and needs 610 level-2 community \
reports, averaging 1,000 tokens each, for a total of 610,000 tokens. LightRAG uses fewer than 100 \
tokens for keyword generation and retrieval, and needs only a single API call. Query times of both \
are reported in the appendix.
"""
FUNCTIONAL = """\
Functional Programming HOWTO

Generators are a special class of functions that simplify the task of writing iterators. Regular \
functions compute a value and return it, but generators return an iterator that returns a stream \
of values. Any function containing a yield keyword is a generator function.

Iterators are objects that return the stream's elements one at a time through their __next__ \
method. An iterator that is exhausted raises StopIteration.
"""
SORTING = """\
Sorting HOWTO

This HOWTO says how to sort lists with sorted() and list.sort(). Generators of keys are not needed: \
a key function returns the value to sort by.
"""


def rows_of(documents: dict[str, str], question: str, *, history=()) -> RetrievalResult:
    rows = []
    for document_id, (title, text) in enumerate(documents.items(), 1):
        for span in chunk_text(text, size=400, overlap=0):
            rows.append(
                ChunkRow(
                    id=f"S{len(rows) + 1}",
                    chunk_id=len(rows) + 1,
                    document_id=document_id,
                    document_title=title,
                    text=span.text,
                    token_count=span.token_count,
                    char_start=span.char_start,
                    char_end=span.char_end,
                    support=0,
                    found_by="vector",
                )
            )
    keywords = _nlp_keywords_in_context(question, list(history))
    referred = tuple(turn["content"] for turn in history if turn["role"] == "user")
    return RetrievalResult(mode="mix", question=question, keywords=keywords, chunks=rows, referred=referred)


def first_line(question: str, documents: dict[str, str], **kwargs) -> str:
    return extractive_answer(question, rows_of(documents, question, **kwargs)).split("\n\n")[0]


def test_a_question_asking_for_a_list_gets_the_table_first_with_its_header():
    answer = extractive_answer(
        "Which logging levels exist?", rows_of({"logging.html": LOGGING_HOWTO, "handlers.html": HANDLERS}, "x")
    )

    head = answer.split("\n\n[S")[0]
    assert head.startswith("The numeric values of logging levels are given in the following table.")
    assert "| Level | Numeric value |" in head
    for level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        assert f"| {level} |" in head


LEVEL_ADVICE = """\
Custom levels

Defining your own levels is possible, but should not be necessary, as the existing levels have been \
chosen on the basis of practical experience.

The logger methods set and use logging levels:

- Logger.setLevel() sets the lowest logging level a logger will handle.
- Logger.debug() and Logger.info() log a message at their logging levels.
"""


def test_which_things_exist_is_answered_by_the_table_of_them_not_by_the_word_existing():
    # "exist" asks for a list; a sentence saying "existing levels" does not give one, and of the
    # table and the list that both speak of levels, the table headed "Level" lists them.
    question = "Which logging levels exist?"

    answer = extractive_answer(
        question, rows_of({"advice.html": LEVEL_ADVICE, "logging.html": LOGGING_HOWTO}, question)
    )

    head = answer.split("\n\n[S")[0]
    assert head.startswith("The numeric values of logging levels are given in the following table.")
    assert "| Level | Numeric value |" in head


def test_a_question_asking_how_much_gets_the_sentence_with_the_number_first():
    line = first_line("How much cheaper is LightRAG's retrieval than GraphRAG's, in tokens?", {"paper": LIGHTRAG})

    assert "610,000 tokens" in line


def test_a_question_asking_which_year_gets_the_sentence_with_the_date_first():
    film = (
        "Always\n\nAlways is a South Korean romance film directed by Song Il-gon, starring So Ji-sub. Its Indian "
        "remake is Do Lafzon Ki Kahani. The South Korean film opened in Seoul in October 2011."
    )

    line = first_line("Always is a South Korean film remade in India; it was released in which year?", {"Always": film})

    assert "2011" in line


def test_a_question_naming_a_document_is_answered_from_it_without_padding():
    question = "What does the functional programming HOWTO say about generators?"
    documents = {"Functional Programming HOWTO": FUNCTIONAL, "Sorting HOWTO": SORTING}

    lines = extractive_answer(question, rows_of(documents, question)).splitlines()

    assert lines[0].startswith("- Generators are a special class of functions")
    assert not any("sort" in line for line in lines)


def test_a_document_is_named_by_its_heading_as_well_as_its_file_name():
    # Uploaded as howto-functional.html, the page is titled by its heading, which each chunk's
    # section path begins with: the introduction saying "functional programming" and "generators"
    # no longer outranks the sentence that says what generators are.
    question = "What does the functional programming HOWTO say about generators?"
    sections = {
        "Functional Programming HOWTO > Introduction": (
            "After an introduction to the concepts of functional programming, we will look at language features "
            "such as iterators and generators."
        ),
        "Functional Programming HOWTO > Generators": (
            "Generators are a special class of functions that simplify the task of writing iterators."
        ),
    }
    result = rows_of({"howto-functional.html": " ".join(sections.values())}, question)
    rows, start = [], 0
    for number, (section, text) in enumerate(sections.items(), 1):
        rows.append(
            replace(
                result.chunks[0],
                id=f"S{number}",
                chunk_id=number,
                text=text,
                section=section,
                char_start=start,
                char_end=start + len(text),
            )
        )
        start += len(text) + 1

    lines = extractive_answer(question, replace(result, chunks=rows)).splitlines()

    assert lines[0].startswith("- Generators are a special class of functions")


SORTING_PAGE = """\
Sorting HOW TO

Author:
- Andrew Dalke and Raymond Hettinger
Release:
- 0.1

Python lists have a built-in list.sort() method that modifies the list in-place. The Sorting HOW TO \
shows how to use it; see the Logging Cookbook for logging recipes.
"""


def test_who_wrote_a_page_is_answered_by_its_author_field():
    question = "Who wrote the Sorting HOW TO, and which release is it?"

    lines = extractive_answer(question, rows_of({"howto-sorting.html": SORTING_PAGE}, question)).splitlines()

    assert lines[0] == "- Author: Andrew Dalke and Raymond Hettinger [S1]"
    assert "- Release: 0.1 [S1]" in lines


def test_who_created_something_is_still_answered_by_a_sentence_naming_them():
    question = "Who created Python?"
    page = "Python\n\nPython was created by Guido van Rossum at CWI. The Python Software Foundation holds it."

    assert "Guido van Rossum" in first_line(question, {"python.html": page})


def test_a_follow_up_is_answered_with_its_own_ask_on_the_earlier_topic():
    earlier = "What does the functional programming HOWTO say about generators?"
    history = [{"role": "user", "content": earlier}, {"role": "assistant", "content": "Generators ..."}]
    question = "And how do they differ from iterators?"

    lines = extractive_answer(
        question, rows_of({"Functional Programming HOWTO": FUNCTIONAL}, question, history=history)
    ).splitlines()

    # The topic (generators) comes from the turn before, the ask (iterators) from this one.
    assert "Generators" in lines[0]
    assert "iterator" in lines[0]
    assert len(lines) <= 3


VENV = """\
Creating Virtual Environments

The module used to create and manage virtual environments is called venv. It will usually install \
the most recent version of Python that you have.

To create a virtual environment, decide upon a directory where you want to place it, and run the \
venv module as a script with the directory path:

python3 -m venv project-env

This will create the project-env directory if it does not exist, and also create directories \
inside it containing a copy of the Python interpreter.
"""
SETS = """\
Sets

A set is an unordered collection with no duplicate elements. Curly braces or the set() function \
can be used to create sets. To create an empty set you have to use set(), not {}; the latter creates \
an empty dictionary.

Dictionaries

A dictionary is a set of key: value pairs, with the requirement that the keys are unique.
"""
ITERATORS = """\
Iterators

Iterators are an important foundation for writing functional-style programs. An iterator is an \
object representing a stream of data; this object returns the data one element at a time. \
Several of Python's built-in data types support iteration, the most common being lists and \
dictionaries.
"""


def test_a_question_asking_how_to_gets_the_command_with_the_sentence_that_introduces_it():
    question = "How do I create a virtual environment?"

    answer = extractive_answer(question, rows_of({"venv.html": VENV}, question))

    head = answer.split("\n\n[S")[0]
    assert head.startswith("To create a virtual environment, decide upon a directory")
    assert "```\npython3 -m venv project-env\n```" in head


def test_a_question_asking_how_to_gets_a_sentence_naming_the_call():
    line = first_line("How do I create an empty set?", {"datastructures.html": SETS})

    assert "use set(), not {}" in line


def test_a_question_asking_what_something_is_gets_the_sentence_that_defines_it_first():
    line = first_line("What is an iterator?", {"functional.html": ITERATORS})

    assert line.startswith("- An iterator is an object representing a stream of data")


def test_code_lines_are_read_as_code_and_sentences_naming_calls_are_not():
    blocks = [kind for kind, _ in _blocks(VENV + "\n" + SETS + "\n>>> basket = {'apple'}\n>>> len(basket)\n1\n")]

    assert blocks == ["code", "code"]


BANDS = {
    "Circus Diablo": "Circus Diablo\n\nCircus Diablo is an American rock band, formed in early 2006 by Billy Morrison.",
    "The Exies": "The Exies\n\nThe Exies were an American rock band from Los Angeles, California, formed in 1997.",
}


def test_a_question_comparing_two_named_things_is_answered_about_each():
    # The question names both documents: neither is its scope, and each gets its sentence.
    question = "Which band was formed first, The Exies or Circus Diablo?"

    answer = extractive_answer(question, rows_of(BANDS, question))

    assert "formed in early 2006" in answer
    assert "formed in 1997" in answer


STOCKDALE = {
    "In Love and War": (
        "In Love and War\n\nIn Love and War (1987) is a Vietnam war television film starring James Woods. "
        "It was directed by Paul Aaron."
    ),
    "James Stockdale": (
        "James Stockdale\n\nJames Bond Stockdale was a United States Navy vice admiral awarded the Medal of "
        "Honor in the Vietnam War. He was a prisoner of war for over seven years."
    ),
}


def test_what_the_question_still_asks_completes_the_answer():
    # The film's page names the film; what medal was awarded is on the admiral's page, which shares
    # no name with the question.
    question = "The person James Woods plays in the television film In Love and War was awarded what medal?"

    lines = extractive_answer(question, rows_of(STOCKDALE, question)).splitlines()

    assert lines[0].startswith("- In Love and War (1987)")
    assert any("Medal of Honor" in line for line in lines)
    assert not any("prisoner" in line for line in lines)


ALBUM = {
    "Paper Lanterns": (
        "Paper Lanterns\n\nPaper Lanterns, released in 2003, is the third studio album by singer-songwriter J. Harlow. "
        "It was recorded in two weeks."
    ),
    "J. Harlow": (
        'J. Harlow\n\nJune "J." Harlow (born 1971) is a musician and guitarist from Boise, Idaho. '
        "Her records mix folk and blues."
    ),
}
ELECTION = {
    "Kettle Society election, 2000": (
        "Kettle Society election, 2000\n\nThe Kettle Society elected its chairman on 3 July 2000, following "
        "Arno Vester's resignation."
    ),
    "Arno Vester": "Arno Vester\n\nArno Vester (15 June 1924 – 24 April 2005) was the seventh chairman of the club.",
}


@pytest.mark.parametrize(
    ("documents", "question", "answer"),
    [
        # The bridge goes by its initial, and the page it leads to opens with a title line.
        (ALBUM, "Paper Lanterns is the third studio album by a singer-songwriter from what state?", "Idaho"),
        # The bridge is named in the possessive.
        (ELECTION, "In what year was the man whose resignation led to the Kettle Society election, 2000 born?", "1924"),
    ],
)
def test_the_answer_crosses_to_the_page_of_the_name_it_gives(documents, question, answer):
    lines = extractive_answer(question, rows_of(documents, question)).splitlines()

    assert len(lines) == 2
    assert answer in lines[1]


def test_a_completing_sentence_comes_from_a_passage_retrieved_first():
    # Eleven passages down, a sentence sharing "awarded" and "medal" with the question is about
    # someone else: the answer stops at the film.
    question = "The person James Woods plays in the television film In Love and War was awarded what medal?"
    documents = {"In Love and War": STOCKDALE["In Love and War"]}
    documents |= {f"Harbour {n}": f"Harbour {n}\n\nThe harbour of town {n} freezes in winter." for n in range(10)}
    documents["Ann Price"] = "Ann Price\n\nAnn Price was a nurse awarded a medal for her courage in 1944."

    lines = extractive_answer(question, rows_of(documents, question)).splitlines()

    assert lines[0].startswith("- In Love and War (1987)")
    assert not any("Ann Price" in line for line in lines)


# From the Japanese translation of df(1) (JM project, Debian's manpages-ja), as `man` shows it.
DF_MANUAL = """\
名前
 df - ファイルシステムのディスク容量の使用状況を表示する

説明
 df は、引き数で指定された各ファイル名を含むファイルシステムで 利用可能なディスク容量を表示します。

オプション
 各 FILE が存在するファイルシステムに関する情報を表示します。 デフォルトでは全てのファイルシステムについて表示します。

 -h, --human-readable
 1024 の累乗でサイズを表示する (例: 1023M)

 -H, --si
 1000 の累乗でサイズを表示する (例: 1.1G)

 -i, --inodes
 ブロック使用量の代わりに iノード情報を表示する

 -T, --print-type
 ファイルシステムの種類を表示する
"""


def test_a_manual_option_is_read_with_its_description_and_found_by_the_option_a_question_names():
    assert first_line("dfの-iオプションは何を表示しますか？", {"df.1.txt": DF_MANUAL}) == (
        "- -i, --inodes: ブロック使用量の代わりに iノード情報を表示する [S1]"
    )


@pytest.mark.django_db
def test_an_english_question_asking_for_an_option_gets_the_japanese_manual_line_that_gives_it(settings):
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    documents = {"df.1.txt": DF_MANUAL, "logging.html": LOGGING_HOWTO}

    assert first_line("Which df option shows sizes in powers of 1000?", documents).startswith(
        "- -H, --si: 1000 の累乗でサイズを表示する"
    )


def test_sources_in_another_language_are_still_answered_from_when_the_embedding_model_fails(monkeypatch, caplog):
    def unreachable(texts, *, purpose, usage=None):
        raise LLMError("The embedding model at embeddings.example did not answer.", transient=True)

    monkeypatch.setattr(llm, "embed", unreachable)
    documents = {"df.1.txt": DF_MANUAL, "logging.html": LOGGING_HOWTO}

    # The Japanese lines go unjudged; the answer is made of what words alone can tell.
    answer = extractive_answer("Which df option shows sizes in powers of 1000?", rows_of(documents, "x"))

    assert answer != NO_CONTEXT_ANSWER
    assert answer.startswith("- ")
    assert "were not judged" in caplog.text
