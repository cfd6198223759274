"""What a workspace's team asks and how well it is answered, over a period of days: questions per
day and per mode, time to first token, model calls, tokens and estimated cost, the answers that
cited nothing, failed or were rated down, and which documents are cited (and which are not).

Read from the record of every question (knowledge.models.Answer, written by the ask service), in
a fixed number of queries whatever the number of questions: every figure is an aggregate in SQL
over the workspace's (workspace, created_at) index, and lists are cut in SQL. Tests pin the
count; benchmarks/analytics.py measures the page on 100,000 questions.
"""

from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Aggregate, Count, Exists, FloatField, OuterRef, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from knowledge.models import Answer, Document, Feedback, Workspace

PERIODS = (7, 30, 90)
DEFAULT_PERIOD = 30
LIST_LIMIT = 50
TOP_DOCUMENTS = 10


class Percentile(Aggregate):
    """Postgres' percentile_cont: the value below which `fraction` of the rows fall, interpolated."""

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, *, fraction: float):
        super().__init__(expression, fraction=float(fraction))


@dataclass
class Day:
    day: date
    questions: int = 0
    by_mode: dict[str, int] = field(default_factory=dict)
    answered: int = 0
    no_source: int = 0
    failed: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # None when a model without a price (MODEL_PRICES) answered that day.
    cost: float | None = 0.0
    first_token_p50: float | None = None
    first_token_p95: float | None = None
    up: int = 0
    down: int = 0
    # Questions per mode in the order of Report.modes (most asked first).
    mode_counts: list[int] = field(default_factory=list)


@dataclass
class Report:
    workspace: Workspace
    days: list[Day]
    modes: list[tuple[str, int]]
    totals: Day
    unpriced_models: list[str]
    unanswered: list[Answer]
    unanswered_count: int
    cited_documents: list[dict]
    never_cited: list[dict]
    never_cited_count: int

    @property
    def start(self) -> date:
        return self.days[0].day

    @property
    def end(self) -> date:
        return self.days[-1].day


def _since(days: int, today: date) -> datetime:
    return timezone.make_aware(datetime.combine(today - timedelta(days=days - 1), time.min))


def analytics_report(*, workspace: Workspace, days: int = DEFAULT_PERIOD, today: date | None = None) -> Report:
    today = today or timezone.localdate()
    since = _since(days, today)
    answers = Answer.objects.filter(workspace=workspace, created_at__gte=since).order_by()
    by_day = {today - timedelta(days=offset): Day(day=today - timedelta(days=offset)) for offset in range(days)}
    unpriced: set[str] = set()
    modes: dict[str, int] = {}
    # 1. Counts, calls and tokens per day, mode and model: a few hundred rows at most.
    rows = answers.annotate(day=TruncDate("created_at")).values("day", "mode", "model")
    for row in rows.annotate(
        questions=Count("pk"),
        answered=Count("pk", filter=Q(outcome=Answer.Outcome.ANSWERED)),
        no_source=Count("pk", filter=Q(outcome=Answer.Outcome.ANSWERED, source_count=0)),
        failed=Count("pk", filter=Q(outcome=Answer.Outcome.FAILED)),
        calls=Sum("llm_calls"),
        prompt=Sum("prompt_tokens"),
        completion=Sum("completion_tokens"),
    ):
        day = by_day.get(row["day"])
        if day is None:
            continue
        day.questions += row["questions"]
        day.by_mode[row["mode"]] = day.by_mode.get(row["mode"], 0) + row["questions"]
        modes[row["mode"]] = modes.get(row["mode"], 0) + row["questions"]
        day.answered += row["answered"]
        day.no_source += row["no_source"]
        day.failed += row["failed"]
        day.llm_calls += row["calls"] or 0
        day.prompt_tokens += row["prompt"] or 0
        day.completion_tokens += row["completion"] or 0
        cost = model_cost(row["model"], row["prompt"] or 0, row["completion"] or 0)
        if cost is None:
            unpriced.add(row["model"])
            day.cost = None
        elif day.cost is not None:
            day.cost += cost
    # 2. Time to first token per day.
    timed = answers.exclude(first_token_ms=None).annotate(day=TruncDate("created_at")).values("day")
    for row in timed.annotate(
        p50=Percentile("first_token_ms", fraction=0.5), p95=Percentile("first_token_ms", fraction=0.95)
    ):
        if row["day"] in by_day:
            by_day[row["day"]].first_token_p50, by_day[row["day"]].first_token_p95 = row["p50"], row["p95"]
    # 3. Feedback per day of the answer.
    feedback = Feedback.objects.filter(answer__workspace=workspace, answer__created_at__gte=since).order_by()
    for row in feedback.annotate(day=TruncDate("answer__created_at")).values("day", "rating").annotate(n=Count("pk")):
        if row["day"] in by_day:
            setattr(by_day[row["day"]], "up" if row["rating"] == Feedback.Rating.UP else "down", row["n"])
    ordered = sorted(by_day.values(), key=lambda day: day.day)
    totals = _totals(ordered)
    # 4. The period's time to first token as a whole (a percentile of percentiles would be wrong).
    overall = answers.exclude(first_token_ms=None).aggregate(
        p50=Percentile("first_token_ms", fraction=0.5), p95=Percentile("first_token_ms", fraction=0.95)
    )
    totals.first_token_p50, totals.first_token_p95 = overall["p50"], overall["p95"]
    ranked = sorted(modes.items(), key=lambda item: (-item[1], item[0]))
    for day in ordered:
        day.mode_counts = [day.by_mode.get(mode, 0) for mode, _ in ranked]
    unanswered, unanswered_count = _unanswered(answers)
    never_cited, never_cited_count = _never_cited(workspace, since)
    return Report(
        workspace=workspace,
        days=ordered,
        modes=ranked,
        totals=totals,
        unpriced_models=sorted(unpriced),
        unanswered=unanswered,
        unanswered_count=unanswered_count,
        cited_documents=_most_cited(workspace, since),
        never_cited=never_cited,
        never_cited_count=never_cited_count,
    )


def model_cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """Dollars for these tokens at MODEL_PRICES (per million input and output tokens); answers
    without a model cost nothing, a model without a price is None."""
    if model == "extractive" or not (prompt_tokens or completion_tokens):
        return 0.0
    price = settings.MODEL_PRICES.get(model)
    if price is None:
        return None
    return (prompt_tokens * price[0] + completion_tokens * price[1]) / 1_000_000


def _totals(days: list[Day]) -> Day:
    totals = Day(day=days[-1].day)
    for day in days:
        for name in ("questions", "answered", "no_source", "failed", "llm_calls", "prompt_tokens", "completion_tokens"):
            setattr(totals, name, getattr(totals, name) + getattr(day, name))
        totals.up, totals.down = totals.up + day.up, totals.down + day.down
        totals.cost = None if totals.cost is None or day.cost is None else totals.cost + day.cost
    return totals


def _unanswered(answers) -> tuple[list[Answer], int]:
    """What we could not answer: answers that cited nothing, failed, or a member rated down;
    newest first, with the downs and the latest comment."""
    # EXISTS rather than a join and a count: the newest 50 come from the index scanned backwards,
    # stopping at the 50th, instead of grouping every answer of the period first.
    rated_down = Exists(Feedback.objects.filter(answer=OuterRef("pk"), rating=Feedback.Rating.DOWN))
    flagged = answers.filter(
        Q(outcome=Answer.Outcome.ANSWERED, source_count=0) | Q(outcome=Answer.Outcome.FAILED) | rated_down
    )
    rows = list(flagged.select_related("user").defer("sources", "text").order_by("-created_at", "-id")[:LIST_LIMIT])
    downs = {row.pk: (0, "") for row in rows}
    for feedback in (
        Feedback.objects.filter(answer__in=list(downs), rating=Feedback.Rating.DOWN)
        .order_by("answer_id", "-updated_at")
        .values("answer_id", "comment")
    ):
        count, comment = downs[feedback["answer_id"]]
        downs[feedback["answer_id"]] = (count + 1, comment or feedback["comment"])
    for row in rows:
        row.downs, row.comment = downs[row.pk]
        row.reasons = [
            reason
            for reason, applies in (
                ("failed", row.outcome == Answer.Outcome.FAILED),
                ("no source", row.outcome == Answer.Outcome.ANSWERED and row.source_count == 0),
                (f"rated down ×{row.downs}", row.downs > 0),
            )
            if applies
        ]
    return rows, flagged.count()


def _most_cited(workspace: Workspace, since: datetime) -> list[dict]:
    """The documents the period's answers cite most, counted once per answer."""
    sql = """
        SELECT cited.document_id, document.title, COUNT(*) AS answers
        FROM knowledge_answer AS answer
        CROSS JOIN LATERAL unnest(answer.cited_documents) AS cited(document_id)
        JOIN knowledge_document AS document ON document.id = cited.document_id
        WHERE answer.workspace_id = %s AND answer.created_at >= %s
        GROUP BY cited.document_id, document.title
        ORDER BY answers DESC, document.title
        LIMIT %s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [workspace.pk, since, TOP_DOCUMENTS])
        return [{"id": row[0], "title": row[1], "answers": row[2]} for row in cursor.fetchall()]


def _never_cited(workspace: Workspace, since: datetime) -> tuple[list[dict], int]:
    """Processed documents no answer of the period cited, oldest first (the longest unused). The
    period, not all time: a document last cited a year ago is as unused as one never cited, and
    the scan stays on the period's stretch of the index."""
    sql = """
        SELECT document.id, document.title, document.created_at, COUNT(*) OVER () AS total
        FROM knowledge_document AS document
        WHERE document.workspace_id = %s AND document.status = %s
          AND document.id NOT IN (
            SELECT DISTINCT unnest(answer.cited_documents) FROM knowledge_answer AS answer
            WHERE answer.workspace_id = %s AND answer.created_at >= %s
          )
        ORDER BY document.created_at, document.id
        LIMIT %s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [workspace.pk, Document.Status.PROCESSED, workspace.pk, since, LIST_LIMIT])
        rows = cursor.fetchall()
    return [{"id": row[0], "title": row[1], "created_at": row[2]} for row in rows], rows[0][3] if rows else 0


CSV_HEADER = (
    "date",
    "questions",
    "answered",
    "no_source",
    "failed",
    "thumbs_up",
    "thumbs_down",
    "first_token_ms_p50",
    "first_token_ms_p95",
    "model_calls",
    "prompt_tokens",
    "completion_tokens",
    "estimated_cost_usd",
)


def csv_rows(report: Report) -> list[list]:
    """The report's days as the CSV export writes them, a column per mode after the fixed ones,
    and a total row: the same numbers as the page."""
    modes = [mode for mode, _ in report.modes]

    def row(label, day: Day) -> list:
        return [
            label,
            day.questions,
            day.answered,
            day.no_source,
            day.failed,
            day.up,
            day.down,
            "" if day.first_token_p50 is None else round(day.first_token_p50),
            "" if day.first_token_p95 is None else round(day.first_token_p95),
            day.llm_calls,
            day.prompt_tokens,
            day.completion_tokens,
            "" if day.cost is None else f"{day.cost:.4f}",
            *(day.by_mode.get(mode, 0) for mode in modes),
        ]

    totals = report.totals
    totals.by_mode = dict(report.modes)
    header = [*CSV_HEADER, *(f"mode_{mode}" for mode in modes)]
    return [header, *(row(day.day.isoformat(), day) for day in report.days), row("total", totals)]
