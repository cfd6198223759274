"""Which earlier turns of a conversation a question refers to.

A question that stands on its own retrieves for itself: folding earlier questions into its
keywords and its chunk search would pull the old topic back in ("Who founded Acme?", then
"Where is Nordwind based?"). A follow-up ("and who founded it?", "what about its price?",
"and the second one?") cannot be retrieved without the turns it points back to. spaCy's
tagger and parser (the pipeline of the question's language, with that language's words from
knowledge/rag/language.py) tell them apart, on the same rules with or without a chat model:

- it opens with a word that continues ("and", "but", "also", "what about", "how about", ...);
- or it has a pronoun or demonstrative that points back ("it", "its", "they", "this", "the
  second one", "there") with no name before it in the question to point to ("Who founded
  Acme and where is it based?" stands on its own);
- or it names nothing at all, no noun and no name ("Why?", "Since when?").

A follow-up refers to the turns back to (and including) the last question that stood on its
own, within the recent turns.
"""

from collections.abc import Sequence

from knowledge.rag import language
from knowledge.rag.language import Language

# Entity types (OntoNotes') that name something; an ordinal, a number or a date does not ("the first one").
_NAMES = {"PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "EVENT", "WORK_OF_ART", "LAW", "LANGUAGE"}
_CLAUSES = {"ccomp", "xcomp", "csubj", "advcl"}


def is_follow_up(question: str) -> bool:
    """Whether the question leans on earlier turns (see the module's rules)."""
    reader = language.of(question)
    (doc,) = reader.parse([question])
    words = [token for token in doc if not token.is_punct and not token.is_space]
    if not words:
        return False
    lowered = [token.lower_ for token in words]
    if lowered[0] in reader.continuing_words or tuple(lowered[:2]) in reader.continuing_pairs:
        return True

    def names(token) -> bool:
        return token.pos_ == "PROPN" or (bool(token.ent_type_) and reader.entity_label(token.ent_type_) in _NAMES)

    named = False
    for token in words:
        if names(token):
            named = True
        elif not named and _points_back(token, reader):
            return True
    return not any(token.pos_ in {"NOUN", "PROPN"} or names(token) for token in words)


def _points_back(token, reader: Language) -> bool:
    word = token.lower_
    if word not in reader.pointing_back or token.dep_.startswith("expl"):
        return False  # "Is there a ...", "Y a-t-il ..."
    if word == "it" and token.dep_ == "nsubj" and any(child.dep_ in _CLAUSES for child in token.head.children):
        return False  # "Is it true that ...", "How long does it take to ..."
    if word in {"that", "this", "these", "those"}:
        return token.tag_ == "DT"  # not the "that" of "the company that makes ..."
    if word in {"one", "ones"}:
        return any(child.dep_ in {"amod", "det"} for child in token.children)  # "the second one", not the number
    if word == "there":
        return token.dep_ == "advmod"  # "who lives there?"
    return True


def referred_turns(question: str, history: Sequence[dict]) -> list[dict]:
    """The turns a follow-up refers to, oldest first: back to the last question of the history
    that stood on its own. Nothing for a question that stands on its own."""
    if not history or not is_follow_up(question):
        return []
    start = len(history)
    for index in range(len(history) - 1, -1, -1):
        if history[index]["role"] == "user":
            start = index
            if not is_follow_up(history[index]["content"]):
                break
    return list(history[start:])
