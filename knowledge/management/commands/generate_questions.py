from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from knowledge.management import workspace_by_slug
from knowledge.services.evaluation.questions import EvaluationError, evaluation_set_generate


class Command(BaseCommand):
    help = (
        "Imagine users, their tasks and questions that need the whole corpus (the LightRAG paper's method) and "
        "store them as an evaluation set. Needs a chat model."
    )

    def add_arguments(self, parser):
        parser.add_argument("--workspace", required=True, help="Workspace slug.")
        parser.add_argument("--name", help="Name of the evaluation set (default: questions-<date and time>).")
        parser.add_argument("--users", type=int, default=5)
        parser.add_argument("--tasks", type=int, default=5, help="Tasks per user.")
        parser.add_argument("--questions", type=int, default=5, help="Questions per user and task.")

    def handle(self, *args, workspace, name, users, tasks, questions, **options):
        target = workspace_by_slug(workspace)
        name = name or f"questions-{timezone.now():%Y-%m-%d-%H%M}"
        try:
            evaluation_set = evaluation_set_generate(
                workspace=target, name=name, users=users, tasks=tasks, questions=questions
            )
        except EvaluationError as exc:
            raise CommandError(str(exc)) from exc
        generation = evaluation_set.generation
        self.stdout.write(f"Corpus: {evaluation_set.corpus_description}\n")
        for question in evaluation_set.questions.all():
            self.stdout.write(f"- {question.text}")
        self.stdout.write(
            self.style.SUCCESS(
                f"\nStored {evaluation_set.questions.count()} questions as evaluation set {name!r} "
                f"({generation['llm_calls']} model calls, {generation['prompt_tokens']} prompt + "
                f"{generation['completion_tokens']} completion tokens). Edit them in the admin; "
                f"run `manage.py evaluate --workspace {workspace} --set {name}`."
            )
        )
