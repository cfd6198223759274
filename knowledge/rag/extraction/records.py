"""Extraction records: a model's answer read line by line, and one chunk's records consolidated
into the mentions the graph merge adds as provenance.

Records, as stored (ChunkExtraction.records):
    {"entities": [{"name", "type", "description"}],
     "relations": [{"source", "target", "keywords", "description", "strength"}],
     "keywords": [str]}
"""

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from knowledge.rag import prompts
from knowledge.rag.names import OTHER_TYPE, QUOTES, entity_key, normalize_name

_LIST_MARKER = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*10)?\s*$")


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
    return " ".join(value.split()).strip(QUOTES + " ")


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
