"""The evaluation page: a workspace's runs, and one run in the paper's layout with cost and verdicts."""

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from knowledge.models import ROLE_RANK, EvaluationRun, EvaluationSet, Role
from knowledge.selectors import workspace_for_user
from knowledge.services.evaluation import SYSTEM_LABELS
from knowledge.services.evaluation.judging import CRITERIA, CRITERION_LABELS


def _context(workspace, **extra) -> dict:
    # The workspace tabs show editor and owner links by these flags.
    return {
        "workspace": workspace,
        "can_edit": ROLE_RANK[workspace.role] >= ROLE_RANK[Role.EDITOR],
        "is_owner": ROLE_RANK[workspace.role] >= ROLE_RANK[Role.OWNER],
        "system_labels": SYSTEM_LABELS,
        **extra,
    }


@login_required
@require_GET
def evaluation_runs(request, slug):
    workspace = workspace_for_user(request.user, slug, Role.VIEWER)
    runs = EvaluationRun.objects.filter(workspace=workspace).select_related("evaluation_set").order_by("-created_at")
    sets = EvaluationSet.objects.filter(workspace=workspace).annotate(question_total=Count("questions"))
    rows = [
        {
            "run": run,
            "overall": run.summary.get("win_rates", {}).get("overall", {}),
            "label_a": SYSTEM_LABELS.get(run.system_a, run.system_a),
            "label_b": SYSTEM_LABELS.get(run.system_b, run.system_b),
        }
        for run in runs
    ]
    return render(request, "knowledge/evaluation.html", _context(workspace, rows=rows, sets=sets))


def _question_rows(run: EvaluationRun) -> list[dict]:
    answers = {(answer.question_id, answer.system): answer for answer in run.answers.all()}
    judgements: dict[int, dict] = {}
    for judgement in run.judgements.all():
        judgements.setdefault(judgement.question_id, {})[judgement.order] = judgement
    rows = []
    for question in run.evaluation_set.questions.all():
        by_order = judgements.get(question.pk, {})
        rows.append(
            {
                "question": question,
                "answer_a": answers.get((question.pk, run.system_a)),
                "answer_b": answers.get((question.pk, run.system_b)),
                "judgements": [by_order[order] for order in ("ab", "ba") if order in by_order],
                "verdicts": [
                    {
                        "label": CRITERION_LABELS[criterion],
                        "by_order": [
                            by_order[order].verdicts.get(criterion) if order in by_order else None
                            for order in ("ab", "ba")
                        ],
                    }
                    for criterion in CRITERIA
                ],
            }
        )
    return rows


@login_required
@require_GET
def evaluation_run(request, slug, pk):
    workspace = workspace_for_user(request.user, slug, Role.VIEWER)
    run = get_object_or_404(EvaluationRun.objects.filter(workspace=workspace).select_related("evaluation_set"), pk=pk)
    summary = run.summary
    table = [
        {"label": CRITERION_LABELS[criterion], **summary["win_rates"][criterion]}
        for criterion in summary.get("criteria", [])
    ]
    cost = [
        {"system": system, "label": SYSTEM_LABELS.get(system, system), **values}
        for system, values in summary.get("cost", {}).items()
    ]
    return render(
        request,
        "knowledge/evaluation_run.html",
        _context(
            workspace,
            run=run,
            summary=summary,
            table=table,
            cost=cost,
            label_a=SYSTEM_LABELS.get(run.system_a, run.system_a),
            label_b=SYSTEM_LABELS.get(run.system_b, run.system_b),
            questions=_question_rows(run),
        ),
    )
