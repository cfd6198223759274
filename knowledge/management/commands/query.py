import json
import re
from dataclasses import asdict

from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand, CommandError

from knowledge.answer import DEFAULT_RESPONSE_TYPE, answer_is_extractive, astream_answer
from knowledge.llm import LLMError, Usage
from knowledge.management import workspace_by_slug
from knowledge.retrieval import DEFAULT_TOP_K, MODES, retrieve


class Command(BaseCommand):
    help = "Ask a workspace a question and print the answer (or, with --json, everything retrieved)."

    def add_arguments(self, parser):
        parser.add_argument("question")
        parser.add_argument("--workspace", required=True, help="the workspace's slug")
        parser.add_argument("--mode", default="mix", choices=MODES)
        parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="entities or relations per search")
        parser.add_argument("--chunk-top-k", type=int, default=None, help="source chunks in the context (20)")
        parser.add_argument("--response-type", default=DEFAULT_RESPONSE_TYPE)
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--context-only", action="store_true", help="print the context instead of answering")

    def handle(self, *args, question, workspace, mode, top_k, chunk_top_k, response_type, **options):
        found = workspace_by_slug(workspace)
        usage = Usage()
        try:
            result = retrieve(
                workspace=found, question=question, mode=mode, top_k=top_k, chunk_top_k=chunk_top_k, usage=usage
            )
        except (ValueError, LLMError) as exc:
            raise CommandError(str(exc)) from exc
        as_json, context_only = options["json"], options["context_only"]
        if context_only and not as_json:
            self.stdout.write(result.context or "(nothing retrieved)")
            return
        answer = None
        if not context_only:
            answer = self._answer(question, result, response_type, usage, echo=not as_json)
        if as_json:
            payload = {
                "answer": answer,
                **result.to_json(include_context=context_only),
                "answer_engine": "extractive" if answer_is_extractive() else "llm",
                "usage": asdict(usage),
            }
            self.stdout.write(json.dumps(payload, ensure_ascii=False, indent=2))
            return
        cited = set(re.findall(r"\[([ERS]\d+)\]", answer))
        sources = [citation for citation in result.citations if citation["id"] in cited]
        if sources:
            self.stdout.write("\nSources:")
        for citation in sources:
            where = "no source text"
            if citation["chunk_id"]:
                where = f"{citation['document_title']}, characters {citation['char_start']}-{citation['char_end']}"
            label = "" if citation["kind"] == "source" else f"{citation['label']}: "
            self.stdout.write(f"  [{citation['id']}] {label}{where}")

    def _answer(self, question, result, response_type, usage, *, echo: bool) -> str:
        async def run() -> str:
            parts = []
            async for piece in astream_answer(
                question=question, result=result, response_type=response_type, usage=usage
            ):
                parts.append(piece)
                if echo:
                    self.stdout.write(piece, ending="")
                    self.stdout.flush()
            if echo:
                self.stdout.write("")
            return "".join(parts)

        try:
            return async_to_sync(run)()
        except LLMError as exc:
            raise CommandError(str(exc)) from exc
