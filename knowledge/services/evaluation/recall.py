"""Retrieval quality without a judge: recall of known supporting chunks and entities.

A synthetic corpus (knowledge.services.evaluation.synthetic) is ingested through the real pipeline; then each of
its questions is retrieved in every mode, and we count how many of the chunks holding its
supporting sentences made it into the context, and how many of its entities (the start of
the chain, the bridge, the answer) the context names.
"""

from dataclasses import dataclass, field

from knowledge.models import Chunk, Document, Workspace
from knowledge.rag.retrieval import retrieve
from knowledge.services import ingestion
from knowledge.services.evaluation.synthetic import SyntheticCorpus, SyntheticQuestion

RECALL_MODES = ("naive", "local", "global", "hybrid", "mix")


def synthetic_corpus_ingest(*, workspace: Workspace, corpus: SyntheticCorpus, created_by=None) -> int:
    """Ingest the corpus's documents that the workspace lacks (by title), in-process. Returns how many were added."""
    present = set(workspace.documents.values_list("title", flat=True))
    added = 0
    for document in corpus.documents:
        if document.title in present:
            continue
        created = ingestion.document_create(
            workspace=workspace,
            user=created_by,
            filename=f"{document.title}.txt",
            text=document.text,
            title=document.title,
            enqueue=False,
        )
        ingestion.document_ingest(document_id=created.pk)
        added += 1
    failed = workspace.documents.filter(status=Document.Status.FAILED).values_list("title", "error").first()
    if failed:
        raise RuntimeError(f"Ingesting {failed[0]!r} failed: {failed[1]}")
    return added


def _supporting_chunks(*, workspace: Workspace, question: SyntheticQuestion) -> set[int]:
    chunk_ids = set()
    for sentence, title in zip(question.supporting_sentences, question.supporting_documents, strict=True):
        chunk = (
            Chunk.objects.filter(workspace=workspace, document__title=title, text__contains=sentence)
            .values_list("pk", flat=True)
            .first()
        )
        if chunk is None:
            raise RuntimeError(f"No chunk of {title!r} holds {sentence!r}; ingest the corpus first.")
        chunk_ids.add(chunk)
    return chunk_ids


@dataclass
class ModeRecall:
    mode: str
    questions: int = 0
    chunk_recall: float = 0.0
    entity_recall: float = 0.0
    complete_support: float = 0.0  # share of questions with every supporting chunk in the context
    by_kind: dict = field(default_factory=dict)  # kind -> {"questions", "chunk_recall", "entity_recall"}

    def to_json(self) -> dict:
        return {
            "mode": self.mode,
            "questions": self.questions,
            "chunk_recall": self.chunk_recall,
            "entity_recall": self.entity_recall,
            "complete_support": self.complete_support,
            "by_kind": self.by_kind,
        }


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 3) if values else 0.0


def retrieval_recall(
    *,
    workspace: Workspace,
    corpus: SyntheticCorpus,
    modes: tuple[str, ...] = RECALL_MODES,
    top_k: int = 10,
    chunk_top_k: int = 5,
    limit: int | None = None,
) -> list[ModeRecall]:
    """Per mode: mean recall of supporting chunks and of entities over the corpus's questions (the first `limit`)."""
    questions = corpus.questions[:limit] if limit else corpus.questions
    supporting = [_supporting_chunks(workspace=workspace, question=question) for question in questions]
    report = []
    for mode in modes:
        rows = []
        for question, chunk_ids in zip(questions, supporting, strict=True):
            result = retrieve(
                workspace=workspace, question=question.text, mode=mode, top_k=top_k, chunk_top_k=chunk_top_k
            )
            found = chunk_ids & {row.chunk_id for row in result.chunks}
            context = result.context.casefold()
            named = [entity for entity in question.entities if entity.casefold() in context]
            rows.append((question.kind, len(found) / len(chunk_ids), len(named) / len(question.entities)))
        recall = ModeRecall(
            mode=mode,
            questions=len(rows),
            chunk_recall=_mean([chunk for _, chunk, _ in rows]),
            entity_recall=_mean([entity for _, _, entity in rows]),
            complete_support=_mean([1.0 if chunk == 1.0 else 0.0 for _, chunk, _ in rows]),
        )
        for kind in sorted({kind for kind, _, _ in rows}):
            of_kind = [(chunk, entity) for k, chunk, entity in rows if k == kind]
            recall.by_kind[kind] = {
                "questions": len(of_kind),
                "chunk_recall": _mean([chunk for chunk, _ in of_kind]),
                "entity_recall": _mean([entity for _, entity in of_kind]),
            }
        report.append(recall)
    return report
