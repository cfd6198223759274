"""Chunk text to records: entities (name, type, description), relations and content keywords.

Two engines fill the same records: a configured chat model (prompted in knowledge/prompts.py,
its answer read by a tolerant line parser) or, offline, the deterministic spaCy extractor in
knowledge/nlp.py. Records are stored per chunk (ChunkExtraction) so a re-run costs nothing.

Records, as stored:
    {"entities": [{"name", "type", "description"}],
     "relations": [{"source", "target", "keywords", "description", "strength"}],
     "keywords": [str]}
"""

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from knowledge import llm, prompts
from knowledge.models import Chunk, ChunkExtraction, Workspace

OTHER_TYPE = "other"
_QUOTES = "\"'`*“”‘’«»„"
_LIST_MARKER = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*10)?\s*$")


def normalize_name(raw: str) -> str:
    """The display name: whitespace collapsed, wrapping quotes and Markdown emphasis removed."""
    name = " ".join(unicodedata.normalize("NFKC", raw).split())
    return name.strip(_QUOTES + " ").strip()


def entity_key(name: str) -> str:
    """The key identical entities share: the display name case-folded."""
    return normalize_name(name).casefold()[:300]


@dataclass
class Parsed:
    entities: list[dict] = field(default_factory=list)
    relations: list[dict] = field(default_factory=list)
    keywords: list[str] = field(default_factory=list)
    skipped: int = 0

    def extend(self, other: "Parsed") -> None:
        self.entities += other.entities
        self.relations += other.relations
        self.keywords += [keyword for keyword in other.keywords if keyword not in self.keywords]
        self.skipped += other.skipped

    def records(self) -> dict:
        return {"entities": self.entities, "relations": self.relations, "keywords": self.keywords}


def _field(value: str) -> str:
    return " ".join(value.split()).strip(_QUOTES + " ")


def _entity_type(raw: str, allowed: dict[str, str]) -> str:
    return allowed.get(_field(raw).casefold(), OTHER_TYPE)


def _strength(value: str) -> float | None:
    match = _NUMBER.match(_field(value))
    if match is None:
        return None
    return min(max(float(match.group(1)), 1.0), 10.0)


def parse_extraction(text: str, *, entity_types: list[str]) -> Parsed:
    """Read a model's extraction answer. Lines that are not a well-formed record are skipped and counted."""
    allowed = {kind.casefold(): kind for kind in entity_types}
    parsed = Parsed()
    for raw_line in text.splitlines():
        line = _LIST_MARKER.sub("", raw_line.strip()).strip().rstrip(";").removesuffix("##").strip()
        if line.startswith("(") and line.endswith(")"):
            line = line[1:-1]
        if not line or line == prompts.DONE_MARKER or line.startswith("```"):
            continue
        fields = [_field(part) for part in line.split(prompts.FIELD_SEPARATOR)]
        tag = fields[0].casefold()
        if tag == "entity" and len(fields) >= 4 and normalize_name(fields[1]):
            parsed.entities.append(
                {
                    "name": normalize_name(fields[1]),
                    "type": _entity_type(fields[2], allowed),
                    "description": " ".join(filter(None, fields[3:])),
                }
            )
        elif tag in ("relation", "relationship") and len(fields) >= 5:
            relation = _relation(fields[1:])
            if relation is None:
                parsed.skipped += 1
            else:
                parsed.relations.append(relation)
        elif tag == "content_keywords" and len(fields) >= 2:
            parsed.keywords += [
                keyword for keyword in (_field(part) for part in ",".join(fields[1:]).split(",")) if keyword
            ]
        else:
            parsed.skipped += 1
    return parsed


def _relation(fields: list[str]) -> dict | None:
    source, target, *rest = fields
    source, target = normalize_name(source), normalize_name(target)
    if not source or not target or entity_key(source) == entity_key(target):
        return None
    strength = _strength(rest[-1])
    if strength is not None:
        rest = rest[:-1]
    else:
        # Some models put the strength first; take any field that is just a number.
        numeric = [index for index, value in enumerate(rest) if _strength(value) is not None]
        strength = _strength(rest.pop(numeric[0])) if numeric else 1.0
    if not rest:
        return None
    keywords, description = (rest[0], " ".join(rest[1:])) if len(rest) > 1 else ("", rest[0])
    return {"source": source, "target": target, "keywords": keywords, "description": description, "strength": strength}


# ---------------------------------------------------------------------------------------
# One chunk's records, consolidated: what the merge adds as provenance


@dataclass
class EntityMention:
    key: str
    name: str
    type: str
    description: str


@dataclass
class RelationMention:
    pair: tuple[str, str]
    keywords: str
    description: str
    strength: float


def _joined(parts: list[str]) -> str:
    seen: dict[str, None] = {}
    for part in parts:
        part = part.strip()
        if part:
            seen.setdefault(part, None)
    return "\n".join(seen)


def keyword_union(values: Iterable[str]) -> str:
    """Comma-separated keywords, de-duplicated case-insensitively, first spelling kept."""
    seen: dict[str, str] = {}
    for value in values:
        for keyword in value.split(","):
            keyword = " ".join(keyword.split())
            if keyword:
                seen.setdefault(keyword.casefold(), keyword)
    return ", ".join(seen.values())


def consolidate(records: dict) -> tuple[dict[str, EntityMention], dict[tuple[str, str], RelationMention]]:
    """One mention per entity key and per unordered pair in a chunk (the two passes may repeat)."""
    names: dict[str, str] = {}
    types: dict[str, Counter] = {}
    descriptions: dict[str, list[str]] = {}
    for record in records.get("entities", []):
        key = entity_key(record["name"])
        if not key:
            continue
        names.setdefault(key, normalize_name(record["name"]))
        if record.get("type"):
            types.setdefault(key, Counter())[record["type"]] += 1
        descriptions.setdefault(key, []).append(record.get("description", ""))
    relation_parts: dict[tuple[str, str], list[dict]] = {}
    for record in records.get("relations", []):
        ends = {entity_key(record["source"]): record["source"], entity_key(record["target"]): record["target"]}
        if len(ends) != 2 or "" in ends:
            continue
        for key, name in ends.items():
            # An endpoint the model did not list as an entity still becomes one.
            names.setdefault(key, normalize_name(name))
            descriptions.setdefault(key, [])
        relation_parts.setdefault(tuple(sorted(ends)), []).append(record)
    entities = {
        key: EntityMention(
            key=key,
            name=name,
            type=types[key].most_common(1)[0][0] if key in types else "",
            description=_joined(descriptions[key]),
        )
        for key, name in names.items()
    }
    relations = {
        pair: RelationMention(
            pair=pair,
            keywords=keyword_union([part.get("keywords", "") for part in parts]),
            description=_joined([part.get("description", "") for part in parts]),
            strength=float(sum(part.get("strength", 1.0) for part in parts)),
        )
        for pair, parts in relation_parts.items()
    }
    return entities, relations


# ---------------------------------------------------------------------------------------
# The extraction step of the pipeline


@dataclass
class ExtractionOutcome:
    records: dict[int, dict]
    errors: list[llm.LLMError]
    usage: llm.Usage
    skipped_lines: int


def engine_name() -> str:
    return "llm" if llm.chat_model_configured() else "spacy"


def extract_chunks(*, chunks: list[Chunk], workspace: Workspace) -> ExtractionOutcome:
    """Records for each chunk: stored ones as they are, the others extracted and stored now.

    A chunk whose model call failed is left out of `records` (its error is in `errors`), so
    the caller can merge what succeeded and resume the rest later.
    """
    stored = dict(ChunkExtraction.objects.filter(chunk__in=chunks).values_list("chunk_id", "records"))
    todo = [chunk for chunk in chunks if chunk.pk not in stored]
    outcome = ExtractionOutcome(records=stored, errors=[], usage=llm.Usage(), skipped_lines=0)
    if not todo:
        return outcome
    if llm.chat_model_configured():
        results = _extract_with_llm(todo, workspace)
    else:
        from knowledge.nlp import nlp_extract

        extracted = nlp_extract([chunk.text for chunk in todo], entity_types=workspace.get_entity_types())
        results = [(Parsed(**records), llm.Usage()) for records in extracted]
    rows = []
    for chunk, result in zip(todo, results, strict=True):
        if isinstance(result, llm.LLMError):
            outcome.errors.append(result)
            continue
        parsed, used = result
        outcome.records[chunk.pk] = parsed.records()
        outcome.usage.add(used)
        outcome.skipped_lines += parsed.skipped
        rows.append(
            ChunkExtraction(
                chunk=chunk,
                engine=engine_name(),
                records=parsed.records(),
                skipped_lines=parsed.skipped,
                prompt_tokens=used.prompt_tokens,
                completion_tokens=used.completion_tokens,
                llm_calls=used.calls,
            )
        )
    ChunkExtraction.objects.bulk_create(rows, ignore_conflicts=True)
    return outcome


def _extract_with_llm(chunks: list[Chunk], workspace: Workspace) -> list[tuple[Parsed, llm.Usage] | llm.LLMError]:
    entity_types = [*workspace.get_entity_types()]
    conversations = [prompts.extraction_messages(text=chunk.text, entity_types=entity_types) for chunk in chunks]
    usages = [llm.Usage() for _ in chunks]
    answers = llm.complete_many(conversations, kind="extract", usage_each=usages, temperature=0)
    results: list[tuple[Parsed, llm.Usage] | llm.LLMError] = []
    parsed_all: list[Parsed | None] = []
    for answer in answers:
        if isinstance(answer, llm.LLMError):
            parsed_all.append(None)
        else:
            parsed_all.append(parse_extraction(answer, entity_types=entity_types))
    for _ in range(workspace.gleaning_passes):
        alive = [index for index, answer in enumerate(answers) if not isinstance(answer, llm.LLMError)]
        if not alive:
            break
        follow_ups = [prompts.gleaning_messages(first=conversations[index], answer=answers[index]) for index in alive]
        gleaned = llm.complete_many(
            follow_ups, kind="glean", usage_each=[usages[index] for index in alive], temperature=0
        )
        for index, conversation, answer in zip(alive, follow_ups, gleaned, strict=True):
            if isinstance(answer, llm.LLMError):
                answers[index] = answer
                parsed_all[index] = None
                continue
            conversations[index] = conversation
            answers[index] = answer
            parsed_all[index].extend(parse_extraction(answer, entity_types=entity_types))
    for answer, parsed, used in zip(answers, parsed_all, usages, strict=True):
        results.append(answer if parsed is None else (parsed, used))
    return results
