import json
from contextlib import aclosing
from dataclasses import asdict

from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand, CommandError

from knowledge.management import workspace_by_slug
from knowledge.models import Workspace
from knowledge.rag.answer.citations import cited_ids
from knowledge.rag.retrieval import DEFAULT_CHUNK_TOP_K, DEFAULT_MODE, DEFAULT_TOP_K, MODES
from knowledge.services.asking import (
    TOP_K_MAX,
    AskError,
    AskRequest,
    DoneEvent,
    ErrorEvent,
    RetrievalEvent,
    TokenEvent,
    ask_request,
    ask_stream,
    check_workspace_ready,
)


class Command(BaseCommand):
    help = "Ask a workspace a question and print the answer (or, with --json, everything retrieved)."

    def add_arguments(self, parser):
        # No argparse choices or bounds: the ask service checks every value, with the same
        # messages the chat and the API give.
        parser.add_argument("question")
        parser.add_argument("--workspace", required=True, help="the workspace's slug")
        parser.add_argument("--mode", help=f"{', '.join(MODES)} (default {DEFAULT_MODE})")
        parser.add_argument(
            "--top-k", type=int, help=f"entities or relations per search, 1-{TOP_K_MAX} (default {DEFAULT_TOP_K})"
        )
        parser.add_argument(
            "--chunk-top-k",
            type=int,
            help=f"source chunks in the context, 1-{TOP_K_MAX} (default {DEFAULT_CHUNK_TOP_K})",
        )
        parser.add_argument("--response-type", help="the form of the answer, e.g. 'Bullet Points'")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--context-only", action="store_true", help="print the context instead of answering")

    def handle(self, *args, question, workspace, mode, top_k, chunk_top_k, response_type, **options):
        found = workspace_by_slug(workspace)
        as_json = options["json"]
        try:
            request = ask_request(
                question=question,
                mode=mode,
                top_k=top_k,
                chunk_top_k=chunk_top_k,
                response_type=response_type,
                context_only=options["context_only"],
            )
            # An operator's command: no membership to check, only whether there is anything to ask.
            check_workspace_ready(workspace=found, mode=request.mode)
        except AskError as exc:
            raise CommandError(str(exc)) from exc
        retrieval, done = async_to_sync(self._ask)(found, request, echo=not as_json and not request.context_only)
        result = retrieval.result
        result.citations = done.citations
        if as_json:
            payload = {
                "answer": done.answer,
                **result.to_json(include_context=request.context_only),
                "answer_engine": retrieval.engine,
                "usage": asdict(done.usage),
            }
            self.stdout.write(json.dumps(payload, ensure_ascii=False, indent=2))
            return
        if request.context_only:
            self.stdout.write(result.context or "(nothing retrieved)")
            return
        by_id = {citation["id"]: citation for citation in result.citations}
        sources = [by_id[row_id] for row_id in cited_ids(done.answer) if row_id in by_id]
        if sources:
            self.stdout.write("\nSources:")
        for citation in sources:
            where = "no source text"
            if citation["sentence"]:
                start, end = citation["sentence_start"], citation["sentence_end"]
                where = f"{citation['document_title']}, characters {start}-{end}: {citation['sentence']}"
            elif citation["chunk_id"]:
                where = f"{citation['document_title']}, characters {citation['char_start']}-{citation['char_end']}"
            label = "" if citation["kind"] == "source" else f"{citation['label']}: "
            self.stdout.write(f"  [{citation['id']}] {label}{where}")

    async def _ask(self, workspace: Workspace, request: AskRequest, *, echo: bool) -> tuple[RetrievalEvent, DoneEvent]:
        """The retrieval and the end of the answer, echoing the answer as it streams."""
        retrieval = None
        async with aclosing(ask_stream(workspace=workspace, request=request)) as events:
            async for event in events:
                if isinstance(event, ErrorEvent):
                    raise CommandError(event.message)
                if isinstance(event, RetrievalEvent):
                    retrieval = event
                elif isinstance(event, TokenEvent) and echo:
                    self.stdout.write(event.text, ending="")
                    self.stdout.flush()
                elif isinstance(event, DoneEvent):
                    if echo:
                        self.stdout.write("")
                    return retrieval, event
