"""The systems an evaluation compares: every retrieval mode, asked through the ask service as a
member would ask, plus the paper's two baselines rebuilt as retrieval variants of our own on
top of retrieve() and answered by the service's answering half:

- hyde: the chat model writes a hypothetical passage answering the question; its passage
  embedding (not the question's) searches the chunks (Gao et al., "Precise Zero-Shot Dense
  Retrieval without Relevance Labels").
- rqrag: the chat model decomposes the question into sub-questions; each searches the chunks,
  and the sources are merged round-robin into one context (in the spirit of RQ-RAG, Chan et
  al., "RQ-RAG: Learning to Refine Queries for Retrieval Augmented Generation").

Each system's answer carries its whole cost: keyword, HyDE or decomposition calls, embedding
requests and the answer itself.
"""

import asyncio
import csv
import io
import math
from contextlib import aclosing
from dataclasses import dataclass, field

from knowledge.models import Workspace
from knowledge.rag import llm
from knowledge.rag.retrieval import MODES, Budgets, QueryVectors, RetrievalResult, retrieve
from knowledge.rag.tokens import count_tokens
from knowledge.services.asking import (
    AskInvalid,
    AskRequest,
    ErrorEvent,
    RetrievalEvent,
    TokenEvent,
    answer_stream,
    ask_request,
    ask_stream,
)
from knowledge.services.evaluation import SYSTEMS
from knowledge.services.evaluation.judging import extract_json
from knowledge.services.evaluation.prompts import DECOMPOSE_USER, HYDE_USER

MAX_SUB_QUESTIONS = 4
CHUNK_TOP_K = 20


@dataclass
class SystemAnswer:
    text: str = ""
    error: str = ""
    usage: llm.Usage = field(default_factory=llm.Usage)
    context_tokens: int = 0
    stats: dict = field(default_factory=dict)


@dataclass
class _Prepared:
    question: str
    # None when the question itself was refused (the answer's error says why).
    request: AskRequest | None
    result: RetrievalResult | None
    answer: SystemAnswer


def answer_questions(
    *, runner: asyncio.Runner, workspace: Workspace, system: str, questions: list[str]
) -> list[SystemAnswer]:
    """Answer every question with one system, all of them concurrently on `runner`'s loop (model
    calls up to LLM_MAX_CONCURRENCY). A mode is asked through the ask service, which retrieves on
    pool threads; a baseline retrieves on this thread, then the service answers.
    A question that fails gets an answer with `error` set, and the rest go on."""
    if system not in SYSTEMS:
        raise ValueError(f"Unknown system {system!r}: use one of {', '.join(SYSTEMS)}.")
    prepared = [_prepare(question, mode=system if system in MODES else "naive") for question in questions]
    asked = [item for item in prepared if item.request is not None]
    if system in MODES:
        runner.run(_gather(_ask(workspace, item) for item in asked))
        return [item.answer for item in prepared]
    if system == "hyde":
        _retrieve_hyde(runner, workspace, asked)
    else:
        _retrieve_decomposed(runner, workspace, asked)
    runner.run(_gather(_answer(item) for item in asked if item.result is not None))
    return [item.answer for item in prepared]


def _prepare(question: str, *, mode: str) -> _Prepared:
    try:
        request = ask_request(question=question, mode=mode, chunk_top_k=CHUNK_TOP_K)
    except AskInvalid as exc:
        return _Prepared(question, None, None, SystemAnswer(error=str(exc)))
    return _Prepared(question, request, None, SystemAnswer())


def _retrieve_into(item: _Prepared, *, workspace: Workspace, **arguments) -> RetrievalResult | None:
    try:
        item.result = retrieve(workspace=workspace, chunk_top_k=CHUNK_TOP_K, usage=item.answer.usage, **arguments)
    except llm.LLMError as exc:
        item.answer.error = exc.public
    return item.result


async def _complete_each(prompts: list[str], usages: list[llm.Usage], *, kind: str) -> list[str | llm.LLMError]:
    async def one(prompt: str, usage: llm.Usage):
        try:
            # Not cached: the cache lives in the database, and this runs off the ORM's thread.
            return await llm.acomplete([{"role": "user", "content": prompt}], kind=kind, usage=usage, cache=False)
        except llm.LLMError as exc:
            return exc

    return await asyncio.gather(*(one(prompt, usage) for prompt, usage in zip(prompts, usages, strict=True)))


def _retrieve_hyde(runner: asyncio.Runner, workspace: Workspace, prepared: list[_Prepared]) -> None:
    passages = runner.run(
        _complete_each(
            [HYDE_USER.format(question=item.question) for item in prepared],
            [item.answer.usage for item in prepared],
            kind="eval-hyde",
        )
    )
    for item, passage in zip(prepared, passages, strict=True):
        if isinstance(passage, llm.LLMError):
            item.answer.error = passage.public
            continue
        try:
            # A passage, embedded as a passage: HyDE matches document to document.
            vector = llm.embed([passage.strip() or item.question], purpose="passage", usage=item.answer.usage)[0]
        except llm.LLMError as exc:
            item.answer.error = exc.public
            continue
        if _retrieve_into(
            item, workspace=workspace, mode="naive", question=item.question, vectors=QueryVectors(question=vector)
        ):
            item.result.stats["hyde_passage"] = passage


def sub_questions(reply: str, *, question: str) -> list[str]:
    """The decomposition's sub-questions; the question itself when the reply holds none."""
    data = extract_json(reply)
    items = data if isinstance(data, list) else []
    found = list(dict.fromkeys(" ".join(str(item).split()) for item in items if str(item).strip()))
    return found[:MAX_SUB_QUESTIONS] or [question]


def _retrieve_decomposed(runner: asyncio.Runner, workspace: Workspace, prepared: list[_Prepared]) -> None:
    replies = runner.run(
        _complete_each(
            [DECOMPOSE_USER.format(question=item.question, count=MAX_SUB_QUESTIONS) for item in prepared],
            [item.answer.usage for item in prepared],
            kind="eval-decompose",
        )
    )
    for item, reply in zip(prepared, replies, strict=True):
        if isinstance(reply, llm.LLMError):
            item.answer.error = reply.public
            continue
        parts = sub_questions(reply, question=item.question)
        per_part = math.ceil(CHUNK_TOP_K / len(parts))
        results = []
        try:
            for part in parts:
                results.append(
                    retrieve(
                        workspace=workspace, question=part, mode="naive", chunk_top_k=per_part, usage=item.answer.usage
                    )
                )
        except llm.LLMError as exc:
            item.answer.error = exc.public
            continue
        item.result = merged_result(question=item.question, results=results)
        item.result.stats["sub_questions"] = parts


def _csv_line(values) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def merged_result(*, question: str, results: list[RetrievalResult], budget: int | None = None) -> RetrievalResult:
    """One naive-style result from several: sources taken round-robin (each sub-question's best
    first), duplicates dropped, renumbered S1.., and as many whole rows as the budget holds."""
    budget = budget or Budgets().total
    merged, seen = [], set()
    for position in range(max((len(result.chunks) for result in results), default=0)):
        for result in results:
            if position < len(result.chunks) and result.chunks[position].chunk_id not in seen:
                seen.add(result.chunks[position].chunk_id)
                merged.append(result.chunks[position])
    merged = merged[:CHUNK_TOP_K]
    head = f"-----Sources-----\n```csv\n{_csv_line(['id', 'document', 'text'])}"
    used = count_tokens(head) + count_tokens("```\n")
    kept, lines = [], []
    for row in merged:
        line = _csv_line([f"S{len(kept) + 1}", row.document_title, row.text])
        if used + count_tokens(line) > budget:
            break
        used += count_tokens(line)
        row.id = f"S{len(kept) + 1}"
        kept.append(row)
        lines.append(line)
    citations = {citation["chunk_id"]: citation for result in results for citation in result.citations}
    combined = RetrievalResult(mode="naive", question=question, chunks=kept)
    combined.context = head + "".join(lines) + "```\n" if kept else ""
    combined.citations = [{**citations[row.chunk_id], "id": row.id} for row in kept if row.chunk_id in citations]
    combined.stats = {"tokens": {"chunks": used if kept else 0, "context": count_tokens(combined.context)}}
    return combined


async def _gather(coroutines) -> None:
    await asyncio.gather(*coroutines)


async def _ask(workspace: Workspace, item: _Prepared) -> None:
    async with aclosing(ask_stream(workspace=workspace, request=item.request, usage=item.answer.usage)) as events:
        async for event in events:
            if isinstance(event, RetrievalEvent):
                _record_retrieval(item.answer, event.result)
            else:
                _record_answer(item.answer, event)


async def _answer(item: _Prepared) -> None:
    _record_retrieval(item.answer, item.result)
    async with aclosing(answer_stream(request=item.request, result=item.result, usage=item.answer.usage)) as events:
        async for event in events:
            _record_answer(item.answer, event)


def _record_retrieval(answer: SystemAnswer, result: RetrievalResult) -> None:
    answer.context_tokens = result.stats.get("tokens", {}).get("context", 0)
    answer.stats = {key: value for key, value in result.stats.items() if key != "timings"}
    answer.stats["keywords"] = result.keywords.to_json()
    answer.stats["sources"] = len(result.chunks)
    answer.stats["entities"] = len(result.entities)
    answer.stats["relations"] = len(result.relations)


def _record_answer(answer: SystemAnswer, event) -> None:
    if isinstance(event, TokenEvent):
        answer.text += event.text
    elif isinstance(event, ErrorEvent):
        answer.error = event.message
