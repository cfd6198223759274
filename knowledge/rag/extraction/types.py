"""The type of a named entity found by the rules extractor: spaCy's label, corrected by what the
name looks like and what its sentence says it is.

spaCy's small English model was trained on news. On documentation it calls most identifiers
people or companies ("Enum" a person, "FileHandler" an organization), and on encyclopedic text it
misses what the text states outright ("Toccata ... is an organ composition", "violinist David
Oistrakh"). A careful reader types from the same evidence, in this order:

1. The shape of the name: dotted ("str.format"), with digits glued to a lower-case word
   ("expr2"), with "+" ("C/C++/Java") or followed by "()" in its sentence, it is code, so
   technology. Camel case ("LogRecord", "GraphRAG") is code in a text that has code in it, and
   wherever spaCy took it for a person or a place; elsewhere companies are camel-cased too.
2. People the text names in full: a single word spaCy calls a company that is the surname of a
   person named in the same text ("Morrison" after "Richard Morrison"), or a name of initials and
   a surname ("B R Chopra").
3. In English, the name's own head noun ("Black River", "Aloha Stadium", "Akhil Krishna Films",
   "Generator Expressions", "University of Paris"), then its sentence: "the logging module", "the
   film Blood Street", "violinist David Oistrakh", "Kapolei is a ... community", "directed by X".
4. In English, a single word the text also writes in lower case ("Handler" beside "handler"): a
   term of the text, not a name; an all-capital word of seven letters or more ("CRITICAL",
   "PYTHONPATH") is a constant or a variable, where acronyms of organizations are shorter.
5. spaCy's label, through LABEL_TYPES (a WORK_OF_ART is a work).

Japanese and French texts go through the same function: the shape rules and the surname rule
hold in any language written with spaces; the noun lists are English, so the rest is skipped.

The types are the defaults' (knowledge.models.DEFAULT_ENTITY_TYPES); a workspace without one of
them gets its fallback (a work is a concept where there is no "work"), else "other".
"""

import re

from knowledge.rag.language import Language
from knowledge.rag.names import OTHER_TYPE

LABEL_TYPES = {
    "PERSON": "person",
    "ORG": "organization",
    "GPE": "location",
    "LOC": "location",
    "FAC": "location",
    "EVENT": "event",
    "PRODUCT": "product",
    "WORK_OF_ART": "work",
    "LAW": "concept",
    "LANGUAGE": "concept",
    "NORP": "concept",
}
# Where a workspace lacks a type, the nearest one it may have.
FALLBACK = {"work": "concept", "technology": "concept"}

_HEADS = {
    "technology": (
        "module package library function method class subclass protocol api framework interface format attribute "
        "exception decorator iterator handler logger formatter parser compiler interpreter database server software "
        "object instance variable constant parameter argument keyword algorithm"
    ),
    "concept": "expression level concept theory principle pattern paradigm technique",
    "work": (
        "film movie album song single novel book series sitcom opera symphony concerto sonata composition poem "
        "musical episode documentary painting tutorial howto cookbook handbook manual"
    ),
    "organization": (
        "company corporation firm band label team club party university college school airline airlines airways "
        "brewery publisher organization organisation agency association society institute foundation network "
        "broadcaster studio studios manufacturer bank films records pictures productions industries entertainment "
        "publishing press inc ltd llc corp academy committee commission league federation orchestra choir ministry"
    ),
    "location": (
        "city town village country county province region district island river lake mountain valley airport "
        "stadium arena station highway neighborhood neighbourhood suburb community capital municipality borough "
        "peninsula desert forest sea ocean bay castle palace"
    ),
    "event": (
        "war battle festival championship tournament election outbreak earthquake hurricane storm revolution "
        "olympics ceremony massacre crisis"
    ),
    "person": (
        "actor actress singer songwriter musician rapper writer author novelist poet journalist director producer "
        "filmmaker composer conductor pianist violinist guitarist drummer painter artist sculptor photographer "
        "architect engineer scientist physicist chemist mathematician economist philosopher historian politician "
        "diplomat lawyer judge governor senator president king queen emperor prince princess footballer player "
        "athlete coach boxer wrestler cyclist swimmer businessman businesswoman entrepreneur comedian dancer "
        "missionary priest bishop officer soldier educator teacher professor programmer designer"
    ),
}
# Last words of company names, never of a person's.
COMPANY_WORDS = frozenset(
    {"films", "records", "pictures", "studios", "productions", "industries", "entertainment", "publishing", "inc"}
)
HEAD_TYPES = {noun: kind for kind, nouns in _HEADS.items() for noun in nouns.split()}
# Verbs whose agent ("directed by X") or object ("starring X") is a person.
PERSON_VERBS = frozenset({"direct", "write", "compose", "star", "found", "paint", "sing", "perform", "narrate"})
# Labels a name's shape or sentence may overrule; a product or an event stays one.
# Nationalities and groups (NORP) are mostly adjectives ("Canadian airports"), so no noun beside
# them says what they are.
_NAME_LABELS = frozenset({"PERSON", "ORG", "GPE", "LOC", "FAC"})
# How strong the evidence for a type is, weakest first.
LABEL, HINT, CUE, SHAPE = range(4)

_DOTTED = re.compile(r"\w\.[a-z_]", re.ASCII)
# "LogRecord", "addHandler", "GraphRAG"; not the surnames "McDonald", "MacArthur", "DeVito".
_CAMEL = re.compile(r"[a-z][A-Z]")
_SURNAME_PREFIX = re.compile(r"(?:Mc|Mac|De|Di|Da|Du|La|Le)[A-Z][a-z]+")
_GLUED_DIGITS = re.compile(r"^[a-z]\w*[a-z]\d+$|^[A-Z][a-z]+\d+$")
# A call, a dotted identifier or a snake_case name anywhere in the text.
_CODE_TOKEN = re.compile(r"\w\(\)|^[a-z_]\w*\.[a-z_]\w*$|^[a-z]+_[a-z_]+$", re.ASCII)
_INITIALS = re.compile(r"^(?:[A-Z]\.?\s+)+[A-Z][a-z]+$")
_LONG_CAPITALS = re.compile(r"^[A-Z]{7,}$")


def looks_like_code(span, label: str) -> bool:
    """Whether the name is an identifier. Camel case alone is one only where the name cannot be
    a person or a place, or in a text with code in it: companies are camel-cased too ("WestJet",
    "MoMA")."""
    name = span.text
    if _DOTTED.search(name) or _GLUED_DIGITS.match(name) or "+" in name or _called(span):
        return True
    camel = [word for word in name.split() if _CAMEL.search(word) and not _SURNAME_PREFIX.fullmatch(word)]
    # Short ones are acronyms as often ("MoMA", "SoHo").
    return bool(camel) and ((label in ("PERSON", "GPE", "LOC", "FAC") and len(name) >= 6) or _has_code(span.doc))


def surnames(doc) -> frozenset[str]:
    """The last words of the people a text names in full."""
    return frozenset(entity[-1].text for entity in doc.ents if entity.label_ == "PERSON" and len(entity) > 1)


def named_type(span, label: str, reader: Language, known_surnames: frozenset[str]) -> tuple[str, int]:
    """The default type of the named entity `span`, which spaCy labels `label` (OntoNotes'), and
    the strength of its evidence: a chunk that mentions an entity more than once keeps the type
    of the strongest (a title line read as part of the sentence below it says less than the
    sentence "X is a composition")."""
    name = span.text
    if looks_like_code(span, label):
        return "technology", SHAPE
    if label not in _NAME_LABELS or not reader.spaces:
        return LABEL_TYPES[label], LABEL
    # Places are named after people ("Washington") and spaCy reads some places as people ("SV St.
    # Georg Hamburg"): only a company is corrected to a person.
    if (len(span) == 1 and label == "ORG" and name in known_surnames) or _INITIALS.match(name):
        return "person", CUE
    if reader.code == "en":
        if len(span) > 1 and (own := _own_type(span, label)):
            return own, CUE
        if said := _sentence_type(span):
            return said, CUE
        if len(span) == 1 and _LONG_CAPITALS.match(name):
            return "technology", HINT
        if len(span) == 1 and _written_in_lower_case(span):
            return "concept", HINT
    return LABEL_TYPES[label], LABEL


def phrase_type(span, reader: Language) -> str:
    """The default type of a noun phrase: for one of more than one word, its head's where that is
    technology ("the logging module"), else concept."""
    if reader.code == "en" and len(span) > 1 and _head_type(span[-1]) in ("technology", "concept"):
        return _head_type(span[-1])
    return "concept"


def workspace_type(kind: str, allowed: dict[str, str]) -> str:
    """The workspace's spelling of `kind`, of its fallback, else "other"."""
    if kind in allowed:
        return allowed[kind]
    return allowed.get(FALLBACK.get(kind, ""), OTHER_TYPE)


def _own_type(span, label: str) -> str | None:
    # The head of "University of Paris" is its first word.
    head = next((token for token in span[1:] if token.lower_ == "of"), None)
    head = span.doc[head.i - 1] if head is not None else span[-1]
    # Surnames are nouns too ("Joan Rivers", "Michael Bay", "Tyra Banks"): a person's name keeps
    # its label unless its last word is a company's ("Akhil Krishna Films") or a term's.
    kind = _head_type(head)
    if label == "PERSON" and kind not in ("technology", "concept") and head.lower_ not in COMPANY_WORDS:
        return None
    return kind


def _head_type(token) -> str | None:
    # spaCy leaves a proper noun's plural as it is ("Standard Modules", "Custom Levels").
    word = token.text.lower()
    return HEAD_TYPES.get(token.lemma_.lower()) or HEAD_TYPES.get(word) or HEAD_TYPES.get(word.removesuffix("s"))


def _called(span) -> bool:
    doc = span.doc
    return span.end + 1 < len(doc) and doc[span.end].text == "(" and doc[span.end + 1].text == ")"


def _sentence_type(span) -> str | None:
    """The type the sentence gives the name: a noun beside it, the noun it is said to be, or a
    verb whose agent or object is a person."""
    doc, root = span.doc, span.root
    after = doc[span.end] if span.end < len(doc) else None
    beside = after is not None and after.pos_ == "NOUN" and root.head == after
    # "the logging module"; but a "Telugu actor" is no actor, nor a "London publisher" a publisher.
    if beside and root.dep_ in ("compound", "nmod") and (kind := _head_type(after)) in ("technology", "concept"):
        return kind
    before = span.start - 1
    while before >= 0 and doc[before].pos_ in ("DET", "PUNCT") and before > span.start - 3:
        before -= 1
    before = doc[before] if before >= 0 else None
    if before is not None and before.pos_ == "NOUN" and span.start <= before.head.i < span.end:
        kind = _head_type(before)
        if kind:
            return kind
    if root.dep_ == "nsubj" and root.head.lemma_ == "be":
        for child in root.head.children:
            if child.dep_ == "attr" and child.pos_ == "NOUN" and (kind := _head_type(child)):
                return kind
    if root.dep_ == "pobj" and root.head.dep_ == "agent" and root.head.head.lemma_ in PERSON_VERBS:
        return "person"
    if root.dep_ == "dobj" and root.head.lemma_ == "star":
        return "person"
    return None


def _written_in_lower_case(span) -> bool:
    lower = span.text.lower()
    return len(lower) > 2 and lower != span.text and any(token.text == lower for token in span.doc)


def _has_code(doc) -> bool:
    return any(_CODE_TOKEN.search(token.text) for token in doc)
