"""Dual-level keywords: one cached model call, or spaCy (the pipeline of the question's
language) when there is no chat model."""

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from knowledge.rag import language, llm
from knowledge.rag.prompts import KEYWORDS_SYSTEM, KEYWORDS_USER

logger = logging.getLogger(__name__)

# Conversation messages (user and assistant) that inform keywords, chunk search and the answer.
RECENT_TURNS = 6


@dataclass(frozen=True)
class Keywords:
    high_level: tuple[str, ...] = ()
    low_level: tuple[str, ...] = ()
    # "llm", "nlp" (spaCy, no chat model or an unreadable model reply) or "given" by the caller.
    source: str = "given"

    @classmethod
    def coerce(cls, value) -> "Keywords":
        if isinstance(value, Keywords):
            return value
        if not isinstance(value, dict):
            raise ValueError('keywords must be an object like {"high_level": [...], "low_level": [...]}.')
        return cls(
            high_level=_keyword_list(value.get("high_level", value.get("high_level_keywords"))),
            low_level=_keyword_list(value.get("low_level", value.get("low_level_keywords"))),
        )

    def to_json(self) -> dict:
        return {"high_level": list(self.high_level), "low_level": list(self.low_level), "source": self.source}


def _keyword_list(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple):
        raise ValueError("Keywords must be a list of strings.")
    seen, keywords = set(), []
    for item in value:
        text = " ".join(str(item).split())
        if text and text.casefold() not in seen:
            seen.add(text.casefold())
            keywords.append(text)
    return tuple(keywords)


def parse_keywords(text: str) -> Keywords | None:
    """The keywords in a model's reply, tolerating code fences and prose around the JSON."""
    for value in llm.json_values(text):
        if isinstance(value, dict) and {"high_level_keywords", "low_level_keywords"} & set(value):
            try:
                return replace(Keywords.coerce(value), source="llm")
            except ValueError:
                return None
    return None


# Verbs are not themes: "exist" and "differ" as high-level keywords matched relations about anything.
_CONTENT_POS = {"NOUN", "PROPN", "ADJ"}


def _trimmed(span):
    tokens = [token for token in span if token.is_alpha or token.is_digit or token.pos_ == "PROPN"]
    while tokens and (tokens[0].is_stop or tokens[0].pos_ in {"DET", "PRON"}):
        tokens.pop(0)
    while tokens and tokens[-1].is_stop:
        tokens.pop()
    return span.doc[tokens[0].i : tokens[-1].i + 1] if tokens else None


def nlp_keywords(question: str) -> Keywords:
    """Keywords without a language model: entity and noun-phrase spans are low-level; the same
    spans and the remaining nouns and adjectives (lemmatized) are high-level, never verbs.

    A model names a question's themes; spaCy can only split it. The words left after the noun
    phrases are mostly verbs ("use, find, introduce"), and relations found by them alone were
    near no sentence in particular: the global mode found the answering page for 57% of the
    default-path questions that way, and for 83% with the noun phrases added.

    The question is read by the pipeline of its language, so a Japanese question's keywords are
    its Japanese names and noun phrases (GiNZA), not the English tagger's guesses."""
    (doc,) = language.of(question).parse([question])
    low, covered = [], set()
    for span in sorted([*doc.ents, *doc.noun_chunks], key=lambda span: (span.start, -len(span))):
        trimmed = _trimmed(span)
        if trimmed is not None:
            low.append(trimmed.text)
            covered.update(range(trimmed.start, trimmed.end))
    high = [
        token.lemma_.lower()
        for token in doc
        if token.i not in covered and token.is_alpha and not token.is_stop and token.pos_ in _CONTENT_POS
    ]
    return Keywords(high_level=_keyword_list([*low, *high]), low_level=_keyword_list(low), source="nlp")


def recent_turns(history: Iterable[dict]) -> list[dict]:
    turns = [
        {"role": turn["role"], "content": str(turn["content"])}
        for turn in history
        if turn.get("role") in {"user", "assistant"} and turn.get("content")
    ]
    return turns[-RECENT_TURNS:]


def _history_text(history: Sequence[dict]) -> str:
    return "".join(f"{turn['role']}: {turn['content']}\n" for turn in history)


def _nlp_keywords_in_context(question: str, history: Sequence[dict]) -> Keywords:
    """The question's own keywords first, then what it refers back to: the names of the earlier
    questions become low-level keywords and join the high-level ones too, so that a global
    search for "who founded it?" looks for founding by the company asked about before."""
    own = nlp_keywords(question)
    earlier = [nlp_keywords(turn["content"]) for turn in history if turn["role"] == "user"]
    names = [keyword for keywords in earlier for keyword in keywords.low_level]
    return Keywords(
        high_level=_keyword_list([*own.high_level, *names]),
        low_level=_keyword_list([*own.low_level, *names]),
        source="nlp",
    )


def extract_keywords(*, question: str, history: Sequence[dict] = (), usage: llm.Usage | None = None) -> Keywords:
    """One cached model call when a chat model is configured, else the spaCy extractor.

    `history` is the turns the question refers to (history.referred_turns), none for a
    question that stands on its own."""
    if not llm.chat_model_configured():
        return _nlp_keywords_in_context(question, history)
    conversation = _history_text(history)
    messages = [
        {"role": "system", "content": KEYWORDS_SYSTEM},
        {
            "role": "user",
            "content": KEYWORDS_USER.format(
                history=f"Recent conversation:\n{conversation}\n" if conversation else "", question=question
            ),
        },
    ]
    reply = llm.complete(messages, kind="keywords", usage=usage)
    keywords = parse_keywords(reply)
    if keywords is None or not (keywords.high_level or keywords.low_level):
        logger.warning("The keyword reply had no usable JSON; using the NLP extractor instead: %.200r", reply)
        return _nlp_keywords_in_context(question, history)
    return keywords
