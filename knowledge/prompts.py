"""Prompts. The ingestion prompts come first; query-time prompts go in their own section at the end.

Extraction answers one record per line, fields separated by FIELD_SEPARATOR, so a parser can
skip a damaged line without losing the rest (knowledge/extraction.py reads it).
"""

FIELD_SEPARATOR = "<|>"
DONE_MARKER = "<|DONE|>"

EXTRACTION_SYSTEM = """You build a knowledge graph from documents. From the text you are given, list:

1. Every entity worth knowing about. For each one write a line:
entity<|>NAME<|>TYPE<|>DESCRIPTION
- NAME: the entity's name as written in the text (proper case, no quotes).
- TYPE: exactly one of: {entity_types}. Use "other" if none fits.
- DESCRIPTION: what the text says about this entity: its attributes, role and activities, in one or
  two sentences that stand on their own.

2. Every pair of those entities that the text clearly relates. For each pair write a line:
relation<|>SOURCE<|>TARGET<|>KEYWORDS<|>DESCRIPTION<|>STRENGTH
- SOURCE and TARGET: entity names exactly as in the entity lines.
- KEYWORDS: a few comma-separated words naming the kind of relationship (e.g. "employment, research").
- DESCRIPTION: why and how the two are related, according to the text.
- STRENGTH: a number from 1 (weak, incidental) to 10 (strong, central).

3. One last line with the main themes of the whole text:
content_keywords<|>KEYWORD, KEYWORD, ...

Rules: one record per line, nothing else on it; no numbering, no Markdown, no commentary. Use only what
the text says. Write descriptions in the language of the text. Finish with the line {done}

Example
Text: Marie Curie won the Nobel Prize in Physics in 1903 together with Pierre Curie for their work on
radioactivity at the University of Paris.
Output:
entity<|>Marie Curie<|>person<|>Marie Curie is a physicist who shared the 1903 physics prize.
entity<|>Pierre Curie<|>person<|>Pierre Curie is a physicist who shared the 1903 prize with Marie Curie.
entity<|>Nobel Prize in Physics<|>event<|>The Nobel Prize in Physics of 1903 rewarded work on radioactivity.
entity<|>University of Paris<|>organization<|>The University of Paris is where the Curies did their work.
relation<|>Marie Curie<|>Pierre Curie<|>collaboration, shared award<|>They worked together and shared the prize.<|>9
relation<|>Marie Curie<|>Nobel Prize in Physics<|>award<|>Marie Curie won the Nobel Prize in Physics in 1903.<|>8
relation<|>Marie Curie<|>University of Paris<|>research, workplace<|>Marie Curie worked at the University of Paris.<|>6
content_keywords<|>radioactivity, Nobel Prize, physics research
{done}"""

EXTRACTION_USER = """Text:
{text}

Output:"""

GLEANING_USER = """Some entities or relations in the text were probably missed. List only the missing ones, in the
same format (entity and relation lines; a relation may refer to entities listed before). Do not repeat
lines you already wrote. If nothing was missed, answer only {done}"""

SUMMARY_SYSTEM = """You merge descriptions in a knowledge graph. You are given several descriptions of the same
{subject_kind}, each taken from a different passage. Write one coherent description, in the third person,
that keeps every distinct fact, resolves repetition, and notes contradictions instead of hiding them.
Name the {subject_kind} at the start so the description stands on its own. Use at most {max_words} words.
Answer with the description only."""

SUMMARY_USER = """{subject_kind}: {subject}

Descriptions:
{fragments}

Merged description:"""


def extraction_messages(*, text: str, entity_types: list[str]) -> list[dict]:
    system = EXTRACTION_SYSTEM.format(entity_types=", ".join(entity_types), done=DONE_MARKER)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": EXTRACTION_USER.format(text=text)},
    ]


def gleaning_messages(*, first: list[dict], answer: str) -> list[dict]:
    return [
        *first,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": GLEANING_USER.format(done=DONE_MARKER)},
    ]


def summary_messages(*, subject_kind: str, subject: str, fragments: list[str], max_words: int) -> list[dict]:
    return [
        {
            "role": "system",
            "content": SUMMARY_SYSTEM.format(subject_kind=subject_kind, max_words=max_words),
        },
        {
            "role": "user",
            "content": SUMMARY_USER.format(
                subject_kind=subject_kind.capitalize(),
                subject=subject,
                fragments="\n".join(f"- {fragment}" for fragment in fragments),
            ),
        },
    ]


# ---------------------------------------------------------------------------------------
# Query-time prompts (keywords, answers) follow below this line.
