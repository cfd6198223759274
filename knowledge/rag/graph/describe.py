"""Merged descriptions (fragments, or summaries map-reduced past the context) and embedding texts."""

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings

from knowledge.rag import llm, prompts

logger = logging.getLogger(__name__)

# Room in the model's context for the prompt's own words and the answer.
SUMMARY_PROMPT_OVERHEAD = 600


@functools.lru_cache(maxsize=200_000)
def _tokens(text: str) -> int:
    from knowledge.rag.tokens import count_tokens

    return count_tokens(text)


def _fragments(descriptions: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for description in descriptions:
        for line in description.split("\n"):
            line = line.strip()
            if line:
                seen.setdefault(line, None)
    return list(seen)


def _needs_summary(new: list[str], candidates: list[str]) -> bool:
    # Many new fragments make a description worth a model call only once it is long enough to read
    # worse than a summary would: nine one-line mentions are shorter than the summary of them.
    tokens = sum(map(_tokens, candidates))
    if tokens > settings.SUMMARY_MAX_TOKENS:
        return True
    return len(new) > settings.SUMMARY_TRIGGER and tokens > settings.SUMMARY_MIN_TOKENS


def _within_budget(fragments: list[str]) -> tuple[str, bool]:
    """As many fragments as fit in SUMMARY_MAX_TOKENS, in order (the first one cut if it alone is
    too long), and whether some were left out: then later fragments never get in either."""
    kept, used = [], 0
    for fragment in fragments:
        size = _tokens(fragment)
        if used + size > settings.SUMMARY_MAX_TOKENS:
            if not kept:
                from knowledge.rag.tokens import decode, encode

                kept.append(decode(encode(fragment)[: settings.SUMMARY_MAX_TOKENS]))
            return "\n".join(kept), True
        kept.append(fragment)
        used += size
    return "\n".join(kept), False


@dataclass
class _Summary:
    kind: str
    subject: str
    fragments: list[str]
    result: str = ""


def _groups(fragments: list[str], budget: int) -> list[list[str]]:
    groups, current, used = [], [], 0
    for fragment in fragments:
        size = _tokens(fragment)
        if current and used + size > budget:
            groups.append(current)
            current, used = [], 0
        current.append(fragment)
        used += size
    if current:
        groups.append(current)
    return groups


def _summarize(items: list[_Summary], usage: llm.Usage) -> None:
    """LLM summaries, map-reduced: fragments past the context are summarized in groups first."""
    budget = max(500, settings.LLM_CONTEXT_TOKENS - settings.SUMMARY_MAX_TOKENS - SUMMARY_PROMPT_OVERHEAD)
    max_words = max(30, settings.SUMMARY_MAX_TOKENS * 3 // 4)
    pending = list(items)
    while pending:
        calls, owners = [], []
        for item in pending:
            for group in _groups(item.fragments, budget):
                calls.append(
                    prompts.summary_messages(
                        subject_kind=item.kind, subject=item.subject, fragments=group, max_words=max_words
                    )
                )
                owners.append(item)
        answers = llm.complete_many(calls, kind="summary", usage=usage, temperature=0)
        errors = [answer for answer in answers if isinstance(answer, llm.LLMError)]
        if errors:
            raise errors[0]
        by_item: dict[int, list[str]] = {}
        for item, answer in zip(owners, answers, strict=True):
            by_item.setdefault(id(item), []).append(answer.strip())
        still = []
        for item in pending:
            parts = by_item[id(item)]
            if len(parts) == 1:
                item.result = parts[0]
            else:
                item.fragments = parts
                still.append(item)
        pending = still


@dataclass(frozen=True)
class Summarized:
    """What a row's description folds: its summary (empty when it is plain fragments), the id of
    the last source folded into it and how many sources it folded."""

    summary: str = ""
    through: int = 0
    sources: int = 0


@dataclass(frozen=True)
class Described:
    description: str
    summarized: Summarized
    # Fragments were left out to stay within SUMMARY_MAX_TOKENS (no model to summarize them).
    cut: bool = False


@dataclass(frozen=True)
class Folded:
    """What a row's description already folds, so that only newer sources need reading
    (knowledge.rag.graph.rebuild): its description and whether it was cut, and the last source
    id and the number of sources folded into it."""

    description: str
    cut: bool
    through: int
    sources: int


def _budgeted(fragments: list[str]) -> "Described":
    text, cut = _within_budget(fragments)
    return Described(text, Summarized(), cut)


def _pending(folded: Folded, state: Summarized) -> list[str]:
    """The fragments below the summary in a folded description (all of it without a summary)."""
    text = folded.description
    if state.summary:
        text = text[len(state.summary) :] if text.startswith(state.summary) else ""
    return [line for line in text.split("\n") if line.strip()]


def describe(
    kind: str,
    subjects: dict[int, str],
    sources: dict[int, list[tuple[int, str]]],
    states: dict[int, Summarized],
    usage,
    fallback,
    folded: dict[int, Folded] | None = None,
) -> dict[int, Described]:
    """id -> the merged description of each row, from its sources (id, description) in id order.

    Summaries are incremental, as a model would be asked by hand: a row with a summary adds the
    fragments of sources newer than it below it, and only when those cross the trigger
    (SUMMARY_TRIGGER fragments, or SUMMARY_MAX_TOKENS with the summary) is the model asked again,
    with the summary and the new fragments, map-reduced only when they exceed the context. So a
    row mentioned by every document is summarized once per SUMMARY_TRIGGER new mentions, not at
    every document, and every fragment reaches a summary's input exactly once. A row that lost a
    source its summary folded (a deletion, a failed document, a merge) is summarized again from
    all that remain. Without a chat model: the fragments that fit in SUMMARY_MAX_TOKENS.

    A row in `folded` gets only its sources not folded yet: the result is the one all its
    sources would give, its summary and its folded description taken as they are.
    """
    folded = folded or {}
    result, to_summarize = {}, []
    summarizes = llm.chat_model_configured()  # once per call, not per row: each asking reads Redis
    for pk, subject in subjects.items():
        rows = sources.get(pk, [])
        state = states.get(pk, Summarized())
        prior = folded.get(pk)
        if prior is not None:
            if prior.cut:
                result[pk] = Described(prior.description, Summarized(), cut=True)
                continue
            base = [state.summary] if state.summary else []
            new = _fragments([*_pending(prior, state), *(text for _, text in rows)])
            latest = (max([prior.through, *(source_id for source_id, _ in rows)]), prior.sources + len(rows))
        else:
            folded_here = sum(1 for source_id, _ in rows if source_id <= state.through)
            if state.summary and folded_here == state.sources:
                base, new = [state.summary], _fragments(text for source_id, text in rows if source_id > state.through)
            else:
                base, new = [], _fragments(text for _, text in rows)
            latest = (max(source_id for source_id, _ in rows), len(rows)) if rows else (0, 0)
        candidates = base + [fragment for fragment in new if fragment not in base]
        if not _needs_summary(new, candidates):
            result[pk] = Described("\n".join(candidates), state if base else Summarized())
        elif summarizes:
            to_summarize.append((pk, _Summary(kind, subject, candidates), latest))
        else:
            result[pk] = _budgeted(candidates)
    if to_summarize:
        try:
            _summarize([item for _, item, _ in to_summarize], usage)
            result.update(
                {pk: Described(item.result, Summarized(item.result, *latest)) for pk, item, latest in to_summarize}
            )
        except llm.LLMError:
            if not fallback:
                raise
            logger.warning("summaries failed; keeping budgeted fragments for %d %ss", len(to_summarize), kind)
            for pk, _, _ in to_summarize:
                texts = (text for _, text in sources.get(pk, []))
                if pk in folded:
                    texts = [*_pending(folded[pk], states.get(pk, Summarized())), *texts]
                result[pk] = _budgeted(_fragments(texts))
    return result
