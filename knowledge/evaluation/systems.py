"""The systems an evaluation compares: every retrieval mode, plus the paper's two baselines
rebuilt as retrieval variants of our own on top of retrieve():

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
from dataclasses import dataclass, field

from knowledge import llm
from knowledge.answer import astream_answer
from knowledge.evaluation import SYSTEMS
from knowledge.evaluation.judging import extract_json
from knowledge.evaluation.prompts import DECOMPOSE_USER, HYDE_USER
from knowledge.models import Workspace
from knowledge.retrieval import Budgets, QueryVectors, RetrievalResult, retrieve
from knowledge.tokens import count_tokens

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
    result: RetrievalResult | None
    answer: SystemAnswer


def answer_questions(
    *, runner: asyncio.Runner, workspace: Workspace, system: str, questions: list[str]
) -> list[SystemAnswer]:
    """Answer every question with one system. Model calls of all questions run concurrently
    (up to LLM_MAX_CONCURRENCY) on `runner`'s loop; ORM work stays on this thread between them.
    A question whose model call fails gets an answer with `error` set, and the rest go on."""
    if system not in SYSTEMS:
        raise ValueError(f"Unknown system {system!r}: use one of {', '.join(SYSTEMS)}.")
    prepared = [_Prepared(question, None, SystemAnswer()) for question in questions]
    if system == "hyde":
        _retrieve_hyde(runner, workspace, prepared)
    elif system == "rqrag":
        _retrieve_decomposed(runner, workspace, prepared)
    else:
        for item in prepared:
            _retrieve_into(item, workspace=workspace, mode=system, question=item.question)
    runner.run(_answer_all([item for item in prepared if item.result is not None]))
    return [item.answer for item in prepared]


def _retrieve_into(item: _Prepared, *, workspace: Workspace, **arguments) -> RetrievalResult | None:
    try:
        result = retrieve(workspace=workspace, chunk_top_k=CHUNK_TOP_K, usage=item.answer.usage, **arguments)
    except llm.LLMError as exc:
        item.answer.error = str(exc)
        return None
    # The answer must be to the asked question, whatever text searched for the context.
    result.question = item.question
    item.result = result
    return result


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
            item.answer.error = str(passage)
            continue
        try:
            # A passage, embedded as a passage: HyDE matches document to document.
            vector = llm.embed([passage.strip() or item.question], purpose="passage", usage=item.answer.usage)[0]
        except llm.LLMError as exc:
            item.answer.error = str(exc)
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
            item.answer.error = str(reply)
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
            item.answer.error = str(exc)
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


async def _answer_all(items: list[_Prepared]) -> None:
    await asyncio.gather(*(_answer(item) for item in items))


async def _answer(item: _Prepared) -> None:
    answer = item.answer
    answer.context_tokens = item.result.stats.get("tokens", {}).get("context", 0)
    answer.stats = {key: value for key, value in item.result.stats.items() if key != "timings"}
    answer.stats["keywords"] = item.result.keywords.to_json()
    answer.stats["sources"] = len(item.result.chunks)
    answer.stats["entities"] = len(item.result.entities)
    answer.stats["relations"] = len(item.result.relations)
    pieces = []
    try:
        async for piece in astream_answer(question=item.question, result=item.result, usage=answer.usage):
            pieces.append(piece)
    except llm.LLMError as exc:
        answer.error = str(exc)
    answer.text = "".join(pieces)
