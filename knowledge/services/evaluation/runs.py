"""An evaluation run end to end: answer every question with systems A and B, judge each pair
twice with the order swapped, and store answers, verdicts, cost and the summary table."""

import asyncio
from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from knowledge.models import (
    EvaluationAnswer,
    EvaluationJudgement,
    EvaluationQuestion,
    EvaluationRun,
    EvaluationSet,
    Workspace,
)
from knowledge.rag import llm
from knowledge.services.evaluation import SYSTEM_LABELS, SYSTEMS
from knowledge.services.evaluation.judging import (
    CRITERIA,
    CRITERION_LABELS,
    ORDERS,
    judge_messages,
    parse_verdict,
    verdicts_for_systems,
    win_rates,
)
from knowledge.services.evaluation.questions import EvaluationError, require_chat_model
from knowledge.services.evaluation.systems import SystemAnswer, answer_questions


def evaluation_run_start(
    *,
    workspace: Workspace,
    evaluation_set: EvaluationSet,
    system_a: str,
    system_b: str,
    judge_model: str = "",
    created_by=None,
) -> EvaluationRun:
    require_chat_model("Evaluating")
    for system in (system_a, system_b):
        if system not in SYSTEMS:
            raise EvaluationError(f"Unknown system {system!r}: use one of {', '.join(SYSTEMS)}.")
    if system_a == system_b:
        raise EvaluationError("Systems A and B are the same; compare two different systems.")
    if evaluation_set.workspace_id != workspace.pk:
        raise EvaluationError(f"Evaluation set {evaluation_set.name!r} belongs to another workspace.")
    if not evaluation_set.questions.exists():
        raise EvaluationError(f"Evaluation set {evaluation_set.name!r} has no questions.")
    return EvaluationRun.objects.create(
        workspace=workspace,
        evaluation_set=evaluation_set,
        system_a=system_a,
        system_b=system_b,
        answer_model=llm.chat_model_name(),
        judge_model=judge_model or llm.chat_model_name(),
        created_by=created_by,
    )


def evaluation_run_execute(
    *, run: EvaluationRun, progress: Callable[[str], None] = lambda message: None
) -> EvaluationRun:
    """Answer, judge and summarize. A failure of the whole run marks it failed and re-raises;
    a single failed answer or unreadable verdict is recorded and the run goes on."""
    questions = list(run.evaluation_set.questions.all())
    try:
        with asyncio.Runner() as runner:
            answers = {}
            for label, system in (("a", run.system_a), ("b", run.system_b)):
                progress(f"Answering {len(questions)} questions with {system} ...")
                answered = answer_questions(
                    runner=runner, workspace=run.workspace, system=system, questions=[q.text for q in questions]
                )
                answers[label] = answered
                _store_answers(run, system, questions, answered)
            progress(f"Judging {len(questions)} pairs twice each with {run.judge_model} ...")
            with llm.chat_model_override(run.judge_model):
                judgements = runner.run(_judge_all(questions, answers["a"], answers["b"]))
        EvaluationJudgement.objects.bulk_create(
            EvaluationJudgement(run=run, question=question, **judgement) for question, judgement in judgements
        )
        run.summary = run_summary(run)
        run.status = EvaluationRun.Status.FINISHED
    except BaseException as exc:
        # BaseException too: a run stopped with Ctrl-C must not stay "running" forever.
        run.status = EvaluationRun.Status.FAILED
        run.error = str(exc) or exc.__class__.__name__
        raise
    finally:
        run.finished_at = timezone.now()
        run.save(update_fields=["summary", "status", "error", "finished_at"])
    return run


def _store_answers(run: EvaluationRun, system: str, questions: list[EvaluationQuestion], answered: list[SystemAnswer]):
    with transaction.atomic():
        EvaluationAnswer.objects.bulk_create(
            EvaluationAnswer(
                run=run,
                question=question,
                system=system,
                text=answer.text,
                error=answer.error,
                context_tokens=answer.context_tokens,
                prompt_tokens=answer.usage.prompt_tokens,
                completion_tokens=answer.usage.completion_tokens,
                llm_calls=answer.usage.calls,
                retrieval_stats=answer.stats,
            )
            for question, answer in zip(questions, answered, strict=True)
        )


async def _judge_all(questions, answers_a: list[SystemAnswer], answers_b: list[SystemAnswer]) -> list[tuple]:
    async def judge(question: EvaluationQuestion, answer_a: SystemAnswer, answer_b: SystemAnswer, order: str):
        first, second = (answer_a, answer_b) if order == "ab" else (answer_b, answer_a)
        usage = llm.Usage()
        row = {"order": order, "raw": "", "verdicts": {}, "error": ""}
        if answer_a.error or answer_b.error:
            row["error"] = "not judged: an answer failed (" + (answer_a.error or answer_b.error) + ")"
        else:
            try:
                # Not cached: a judge's verdict is a sample, and re-running a run should draw anew.
                row["raw"] = await llm.acomplete(
                    judge_messages(question=question.text, first=first.text, second=second.text),
                    kind="eval-judge",
                    usage=usage,
                    cache=False,
                )
            except llm.LLMError as exc:
                row["error"] = f"judge call failed: {exc.public}"
            else:
                parsed = parse_verdict(row["raw"])
                row["verdicts"] = verdicts_for_systems(parsed, order=order)
                row["error"] = "; ".join(parsed.problems)
        row |= {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "llm_calls": usage.calls,
        }
        return question, row

    return await asyncio.gather(
        *(
            judge(question, answer_a, answer_b, order)
            for question, answer_a, answer_b in zip(questions, answers_a, answers_b, strict=True)
            for order in ORDERS
        )
    )


def _per_query(total: int, count: int) -> float:
    return round(total / count, 1) if count else 0.0


def run_summary(run: EvaluationRun) -> dict:
    """Win rates per criterion (the paper's table) and the cost of each system and of the judge."""
    judgements = list(run.judgements.all())
    cost = {}
    for system in (run.system_a, run.system_b):
        rows = list(run.answers.filter(system=system))
        count = len(rows)
        cost[system] = {
            "queries": count,
            "failed": sum(1 for row in rows if row.error),
            "prompt_tokens_per_query": _per_query(sum(row.prompt_tokens for row in rows), count),
            "completion_tokens_per_query": _per_query(sum(row.completion_tokens for row in rows), count),
            "calls_per_query": _per_query(sum(row.llm_calls for row in rows), count),
            "context_tokens_per_query": _per_query(sum(row.context_tokens for row in rows), count),
        }
    return {
        "criteria": list(CRITERIA),
        "win_rates": win_rates([judgement.verdicts for judgement in judgements]),
        "judgements": len(judgements),
        "unreadable_judgements": sum(1 for judgement in judgements if judgement.error),
        "cost": cost,
        "judge": {
            "prompt_tokens": sum(judgement.prompt_tokens for judgement in judgements),
            "completion_tokens": sum(judgement.completion_tokens for judgement in judgements),
            "calls": sum(judgement.llm_calls for judgement in judgements),
        },
    }


def summary_table(run: EvaluationRun) -> str:
    """The summary as text: the paper's layout (criteria as rows, baseline B then A as columns), then the cost."""
    summary = run.summary
    heads = [f"{SYSTEM_LABELS[run.system_b]} (B)", f"{SYSTEM_LABELS[run.system_a]} (A)"]
    width = max(len(head) for head in heads) + 2
    lines = [f"{'':<20}" + "".join(f"{head:>{width}}" for head in heads)]
    for criterion in summary["criteria"]:
        rate = summary["win_rates"][criterion]
        cells = [_percent(rate["b_percent"]), _percent(rate["a_percent"])]
        lines.append(f"{CRITERION_LABELS[criterion]:<20}" + "".join(f"{cell:>{width}}" for cell in cells))
    lines += [
        "",
        f"{'Cost per query':<20}{'prompt tok':>12}{'completion tok':>16}{'model calls':>13}{'context tok':>13}",
    ]
    for system, cost in summary["cost"].items():
        lines.append(
            f"{system:<20}{cost['prompt_tokens_per_query']:>12}{cost['completion_tokens_per_query']:>16}"
            f"{cost['calls_per_query']:>13}{cost['context_tokens_per_query']:>13}"
        )
    judge = summary["judge"]
    lines += [
        "",
        f"Judge {run.judge_model}: {judge['calls']} calls, {judge['prompt_tokens']} prompt + "
        f"{judge['completion_tokens']} completion tokens; {summary['unreadable_judgements']} of "
        f"{summary['judgements']} verdicts not (fully) readable.",
    ]
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"
