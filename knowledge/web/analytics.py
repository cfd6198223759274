"""The analytics pages of a workspace, for its owners: what the team asks and how well it is
answered (knowledge/services/analytics.py), the CSV of the same numbers, and the review of one
flagged answer with the conversation it came from."""

import csv

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from chat.rendering import prepare_message
from chat.selectors import conversation_for_review
from knowledge.models import Answer, Role
from knowledge.services import analytics as reports
from knowledge.web import charts
from knowledge.web.views import _context, _workspace


def _period(request) -> int:
    try:
        days = int(request.GET.get("days", reports.DEFAULT_PERIOD))
    except ValueError:
        return reports.DEFAULT_PERIOD
    return days if days in reports.PERIODS else reports.DEFAULT_PERIOD


def _charts(report: reports.Report) -> dict:
    days = [day.day for day in report.days]
    modes = [mode for mode, _ in report.modes]
    return {
        "questions": charts.bar_chart(
            days=days,
            series=[charts.Series(mode, [day.by_mode.get(mode, 0) for day in report.days]) for mode in modes],
        ),
        "first_token": charts.line_chart(
            days=days,
            series=[
                charts.Series("p50", [day.first_token_p50 for day in report.days]),
                charts.Series("p95", [day.first_token_p95 for day in report.days]),
            ],
            unit=" ms",
        ),
        "tokens": charts.bar_chart(
            days=days,
            series=[
                charts.Series("prompt", [day.prompt_tokens for day in report.days]),
                charts.Series("completion", [day.completion_tokens for day in report.days]),
            ],
        ),
        "cost": charts.bar_chart(
            days=days, series=[charts.Series("estimated $", [day.cost or 0 for day in report.days])]
        ),
    }


@login_required
@require_GET
def analytics(request, slug):
    workspace = _workspace(request, slug, Role.OWNER)
    days = _period(request)
    report = reports.analytics_report(workspace=workspace, days=days)
    context = _context(workspace, report=report, days=days, periods=reports.PERIODS, charts=_charts(report))
    return render(request, "knowledge/analytics.html", context)


@login_required
@require_GET
def analytics_csv(request, slug):
    workspace = _workspace(request, slug, Role.OWNER)
    days = _period(request)
    report = reports.analytics_report(workspace=workspace, days=days)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = (
        f'attachment; filename="{workspace.slug}-analytics-{report.start:%Y%m%d}-{report.end:%Y%m%d}.csv"'
    )
    csv.writer(response).writerows(reports.csv_rows(report))
    return response


@login_required
@require_GET
def analytics_answer(request, slug, pk):
    workspace = _workspace(request, slug, Role.OWNER)
    answer = get_object_or_404(Answer.objects.filter(workspace=workspace).select_related("user"), pk=pk)
    turns = conversation_for_review(
        workspace=workspace, conversation_id=answer.conversation_id, until_message_id=answer.message_id
    )
    for message in turns:
        prepare_message(message, workspace=workspace)
    context = _context(
        workspace,
        answer=answer,
        turns=turns,
        feedback=answer.feedback.select_related("user").order_by("-updated_at"),
        cost=reports.model_cost(answer.model, answer.prompt_tokens, answer.completion_tokens),
    )
    return render(request, "knowledge/analytics_answer.html", context)
