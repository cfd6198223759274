"""The answer: a cited Markdown answer streamed from the chat model, or, without one, an
extractive answer made of the source sentences that best match the question.

Both stream the same way (an async generator of text pieces), so the websocket, the HTTP API
and the command treat them alike.
"""

import asyncio
import re
from collections.abc import AsyncIterator, Sequence

from knowledge.rag import llm
from knowledge.rag.answer.extractive import DEFAULT_RESPONSE_TYPE, NO_CONTEXT_ANSWER, extractive_answer
from knowledge.rag.prompts import ANSWER_SYSTEM, BYPASS_SYSTEM
from knowledge.rag.retrieval import RetrievalResult, recent_turns

NO_MODEL_BYPASS_ANSWER = (
    "Bypass mode sends the question to the language model without retrieval, and no language model is "
    "configured. Choose another mode to get an extractive answer from the documents."
)
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
        system = ANSWER_SYSTEM.format(response_type=response_type, context=_as_data(result.context))
    return [{"role": "system", "content": system}, *recent_turns(history), {"role": "user", "content": question}]


_CONTEXT_TAG = re.compile(r"<\s*/?\s*context\s*>", re.IGNORECASE)


def _as_data(context: str) -> str:
    """The context with its delimiters defused: a document that writes "</context>" cannot end
    the data early and have what follows read as instructions."""
    return _CONTEXT_TAG.sub(lambda tag: tag.group(0).replace("<", "‹").replace(">", "›"), context)


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
    elif answer_is_extractive() and result.mode == "bypass":
        text = NO_MODEL_BYPASS_ANSWER
    elif answer_is_extractive():
        # Off the event loop: segmenting twenty chunks takes a noticeable moment.
        text = await asyncio.to_thread(extractive_answer, question, result, response_type)
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
