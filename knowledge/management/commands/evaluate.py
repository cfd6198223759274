from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from knowledge.management import workspace_by_slug
from knowledge.models import EvaluationSet
from knowledge.services.evaluation import SYSTEMS
from knowledge.services.evaluation.questions import EvaluationError
from knowledge.services.evaluation.runs import evaluation_run_execute, evaluation_run_start, summary_table


class Command(BaseCommand):
    help = (
        "Answer every question of an evaluation set with systems A and B, let a judge model compare each pair "
        "twice (answers swapped) on comprehensiveness, diversity, empowerment and overall, and report win rates."
    )

    def add_arguments(self, parser):
        parser.add_argument("--workspace", required=True, help="Workspace slug.")
        parser.add_argument("--set", required=True, dest="set_name", help="Evaluation set name (generate_questions).")
        parser.add_argument("--a", default="mix", choices=SYSTEMS, help="System A (default: mix).")
        parser.add_argument("--b", default="naive", choices=SYSTEMS, help="System B, the baseline (default: naive).")
        parser.add_argument("--judge-model", default="", help="Chat model that judges (default: LLM_MODEL).")

    def handle(self, *args, workspace, set_name, a, b, judge_model, **options):
        target = workspace_by_slug(workspace)
        evaluation_set = EvaluationSet.objects.filter(workspace=target, name=set_name).first()
        if evaluation_set is None:
            names = ", ".join(EvaluationSet.objects.filter(workspace=target).values_list("name", flat=True))
            raise CommandError(f"No evaluation set {set_name!r} in {workspace!r}. Sets: {names or 'none yet'}.")
        try:
            run = evaluation_run_start(
                workspace=target, evaluation_set=evaluation_set, system_a=a, system_b=b, judge_model=judge_model
            )
            run = evaluation_run_execute(run=run, progress=self.stderr.write)
        except EvaluationError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Evaluation run {run.pk}: {a} (A) vs {b} (B) on {set_name!r}\n")
        self.stdout.write(summary_table(run))
        page = reverse("knowledge:evaluation_run", args=[workspace, run.pk])
        self.stdout.write(f"\nStored as run {run.pk}; the evaluation page shows it at {page}")
