"""Chunk text to records: entities (name, type, description), relations and content keywords.

Two engines fill the same records (records.py): a configured chat model (model.py, prompted in
knowledge/rag/prompts.py, its answer read by a tolerant line parser) or, offline, the
deterministic spaCy extractor (rules.py). Records are stored per chunk (ChunkExtraction) so a
re-run costs nothing.
"""

from dataclasses import dataclass, field

from knowledge.models import Chunk, ChunkExtraction, Workspace
from knowledge.rag import llm
from knowledge.rag.extraction.model import extract_with_model
from knowledge.rag.extraction.records import Parsed
from knowledge.rag.extraction.rules import nlp_extract


@dataclass
class ExtractionOutcome:
    records: dict[int, dict]
    errors: list[llm.LLMError]
    usage: llm.Usage
    skipped_lines: int
    # What each chunk's call cost: a run of several documents counts each one's own.
    usage_by_chunk: dict[int, llm.Usage] = field(default_factory=dict)


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
        results = extract_with_model(todo, workspace)
    else:
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
        outcome.usage_by_chunk[chunk.pk] = used
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
