import json
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from knowledge.models import Workspace
from knowledge.rag import llm
from knowledge.services.evaluation.recall import RECALL_MODES, retrieval_recall, synthetic_corpus_ingest
from knowledge.services.evaluation.synthetic import synthetic_corpus


class Command(BaseCommand):
    help = (
        "Ingest a synthetic corpus with known facts into a workspace of its own and print, per mode, the recall "
        "of supporting chunks and of entities in the retrieved context. No judge needed."
    )

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--people", type=int, default=24, help="Person profiles in the corpus.")
        parser.add_argument("--companies", type=int, default=8, help="Company profiles in the corpus.")
        parser.add_argument(
            "--workspace", help="Workspace slug to use (default: synthetic-<seed>-<people>-<companies>)."
        )
        parser.add_argument("--modes", default=",".join(RECALL_MODES), help="Comma-separated modes.")
        parser.add_argument("--top-k", type=int, default=10)
        parser.add_argument("--chunk-top-k", type=int, default=5)
        parser.add_argument("--questions", type=int, help="Only the first N questions.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object instead of a table.")

    def handle(self, *args, seed, people, companies, workspace, modes, top_k, chunk_top_k, questions, **options):
        modes = tuple(mode.strip() for mode in modes.split(",") if mode.strip())
        if unknown := set(modes) - set(RECALL_MODES):
            raise CommandError(f"Unknown mode {sorted(unknown)[0]!r}: use {', '.join(RECALL_MODES)}.")
        try:
            corpus = synthetic_corpus(seed=seed, people=people, companies=companies)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        slug = workspace or f"synthetic-{seed}-{people}-{companies}"
        with transaction.atomic():
            target, _ = Workspace.objects.get_or_create(
                slug=slug,
                defaults={"name": f"Synthetic corpus (seed {seed})", "description": "Made by retrieval_quality."},
            )
        started = time.perf_counter()
        added = synthetic_corpus_ingest(workspace=target, corpus=corpus)
        ingest_seconds = time.perf_counter() - started
        target.refresh_from_db()
        started = time.perf_counter()
        report = retrieval_recall(
            workspace=target, corpus=corpus, modes=modes, top_k=top_k, chunk_top_k=chunk_top_k, limit=questions
        )
        retrieval_seconds = time.perf_counter() - started
        engines = llm.engine_description()
        if options["json"]:
            payload = {
                "workspace": slug,
                "seed": seed,
                "documents": len(corpus.documents),
                "entities": target.entity_count,
                "relations": target.relation_count,
                "top_k": top_k,
                "chunk_top_k": chunk_top_k,
                "extraction": engines["extraction"],
                "embedding": engines["embedding"],
                "modes": [row.to_json() for row in report],
            }
            self.stdout.write(json.dumps(payload, indent=2))
            return
        asked = report[0].questions if report else 0
        self.stdout.write(
            f"Workspace {slug!r}: {len(corpus.documents)} documents ({added} ingested now in {ingest_seconds:.1f}s), "
            f"{target.entity_count} entities, {target.relation_count} relations.\n"
            f"Extraction: {engines['extraction']}. Embeddings: {engines['embedding']}.\n"
            f"{asked} questions per mode, top_k {top_k}, chunk_top_k {chunk_top_k}; "
            f"{retrieval_seconds:.1f}s of retrieval.\n"
        )
        kinds = sorted({kind for row in report for kind in row.by_kind})
        header = f"{'mode':<8}{'chunks':>8}{'entities':>10}{'all support':>13}"
        header += "".join(f"{kind + ' chunks':>17}{kind + ' ents':>15}" for kind in kinds)
        self.stdout.write(header)
        for row in report:
            line = f"{row.mode:<8}{row.chunk_recall:>8.3f}{row.entity_recall:>10.3f}{row.complete_support:>13.3f}"
            for kind in kinds:
                part = row.by_kind.get(kind, {"chunk_recall": 0.0, "entity_recall": 0.0})
                line += f"{part['chunk_recall']:>17.3f}{part['entity_recall']:>15.3f}"
            self.stdout.write(line)
