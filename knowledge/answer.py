"""The answer: a cited Markdown answer streamed from the chat model, or, without one, an
extractive answer made of the source sentences that best match the question.

Both stream the same way (an async generator of text pieces), so the websocket, the HTTP API
and the command treat them alike.
"""

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from functools import cache

from knowledge import llm
from knowledge.query_prompts import ANSWER_SYSTEM, BYPASS_SYSTEM
from knowledge.retrieval import RetrievalResult, recent_turns

DEFAULT_RESPONSE_TYPE = "Multiple Paragraphs"
NO_CONTEXT_ANSWER = (
    "I could not find anything about this in the workspace's documents, so I cannot answer it from them. "
    "Try other words, another mode, or check that the documents you expect have been processed."
)
EXTRACTIVE_LABEL = (
    "_Extractive answer: no language model is configured, so these are the sentences from the sources "
    "that best match your question._"
)
NO_MODEL_BYPASS_ANSWER = (
    "Bypass mode sends the question to the language model without retrieval, and no language model is "
    "configured. Choose another mode to get an extractive answer from the documents."
)
EXTRACTIVE_SENTENCES = 5
_PIECE_WORDS = 3


def answer_is_extractive() -> bool:
    return not llm.chat_model_configured()


def answer_messages(
    *, question: str, result: RetrievalResult, history: Sequence[dict] = (), response_type: str = DEFAULT_RESPONSE_TYPE
) -> list[dict]:
    """The chat messages of the answer call: instructions with the context, recent turns, the question."""
    if result.mode == "bypass":
        system = BYPASS_SYSTEM.format(response_type=response_type)
    else:
        system = ANSWER_SYSTEM.format(response_type=response_type, context=result.context)
    return [{"role": "system", "content": system}, *recent_turns(history), {"role": "user", "content": question}]


async def astream_answer(
    *,
    question: str,
    result: RetrievalResult,
    history: Sequence[dict] = (),
    response_type: str = DEFAULT_RESPONSE_TYPE,
    usage: llm.Usage | None = None,
) -> AsyncIterator[str]:
    """Stream the answer in pieces. Raises llm.LLMError when the chat model fails."""
    if result.mode != "bypass" and not result.context:
        text = NO_CONTEXT_ANSWER
    elif answer_is_extractive():
        text = NO_MODEL_BYPASS_ANSWER if result.mode == "bypass" else extractive_answer(question, result, response_type)
    else:
        messages = answer_messages(question=question, result=result, history=history, response_type=response_type)
        async for piece in llm.astream(messages, usage=usage):
            yield piece
        return
    for piece in _pieces(text):
        yield piece
        # Lets the consumer send each piece (and notice a cancel) as with a model's stream.
        await asyncio.sleep(0)


def _pieces(text: str) -> list[str]:
    words = re.findall(r"\s*\S+\s*", text)
    return ["".join(words[i : i + _PIECE_WORDS]) for i in range(0, len(words), _PIECE_WORDS)]


# ---------------------------------------------------------------------------------------
# Extractive answers

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n{2,}")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def _stem(word: str) -> str:
    word = word.casefold()
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


@cache
def _stop_words() -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS

    return frozenset(STOP_WORDS)


def _terms(text: str) -> set[str]:
    stop_words = _stop_words()
    return {_stem(word) for word in _WORD.findall(text) if len(word) > 2 and word.casefold() not in stop_words}


def extractive_answer(question: str, result: RetrievalResult, response_type: str = DEFAULT_RESPONSE_TYPE) -> str:
    """The sources' sentences with the most support: question and keyword terms they contain
    (twice as much), retrieved entities they name, and how many retrieved rows back their chunk."""
    wanted = _terms(" ".join([question, *result.keywords.high_level, *result.keywords.low_level]))
    names = {row.name.casefold() for row in result.entities if len(row.name) > 2}
    scored = []
    for position, chunk in enumerate(result.chunks):
        for sentence in _SENTENCE_END.split(chunk.text):
            sentence = " ".join(sentence.split())
            if len(sentence) < 20:
                continue
            lowered = sentence.casefold()
            matches = len(wanted & _terms(sentence))
            named = sum(1 for name in names if name in lowered)
            if matches or named:
                score = 2 * matches + named + 0.1 * chunk.support
                scored.append((-score, position, sentence, chunk.id))
    if not scored:
        return NO_CONTEXT_ANSWER
    best, seen = [], set()
    for _, _, sentence, row_id in sorted(scored):
        if sentence.casefold() not in seen:
            seen.add(sentence.casefold())
            best.append(f"{sentence} [{row_id}]")
        if len(best) == EXTRACTIVE_SENTENCES:
            break
    if "paragraph" in response_type.casefold() and "single" in response_type.casefold():
        body = " ".join(best)
    else:
        body = "\n".join(f"- {line}" for line in best)
    return f"{EXTRACTIVE_LABEL}\n\n{body}"
