"""The judge: its prompt, tolerant reading of its replies, and the win-rate arithmetic.

Every pair of answers is judged twice, once with system A shown first ("ab") and once with
B first ("ba"), because judges favour one position. The judge speaks of positions
("Answer 1", "Answer 2"); verdicts are mapped back to systems ("a", "b") before they are
stored, so everything downstream counts systems only.
"""

import re
from dataclasses import dataclass, field

from knowledge.rag import llm
from knowledge.services.evaluation.prompts import JUDGE_SYSTEM, JUDGE_USER

CRITERIA = ("comprehensiveness", "diversity", "empowerment", "overall")
CRITERION_LABELS = {
    "comprehensiveness": "Comprehensiveness",
    "diversity": "Diversity",
    "empowerment": "Empowerment",
    "overall": "Overall",
}
ORDERS = ("ab", "ba")
_POSITION = re.compile(r"(?<![\d.])([12])(?![\d.])")
_WORD_POSITIONS = {"first": 1, "one": 1, "second": 2, "two": 2}
_WINNER_KEYS = ("winner", "better", "choice", "answer", "verdict")
_REASON_KEYS = ("reason", "explanation", "why", "rationale", "justification")


def judge_messages(*, question: str, first: str, second: str) -> list[dict]:
    return [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": JUDGE_USER.format(question=question, first=first, second=second)},
    ]


def extract_json(text: str):
    """The first JSON value in a model's reply, tolerating code fences and stray prose; None if there is none."""
    return next(llm.json_values(text), None)


def _criterion_of(key: str) -> str | None:
    words = re.sub(r"[^a-z]+", " ", str(key).casefold()).split()
    for criterion in CRITERIA:
        if criterion in words:
            return criterion
    # "Overall Winner", "winner" alone: the overall verdict under another name.
    return "overall" if "winner" in words else None


def _position_of(value) -> int | None:
    """1 or 2 from "Answer 1", "answer_2", 2, "the second answer"; None when unclear or both."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value in (1, 2) else None
    found = {int(digit) for digit in _POSITION.findall(str(value))}
    found |= {_WORD_POSITIONS[word] for word in re.findall(r"[a-z]+", str(value).casefold()) if word in _WORD_POSITIONS}
    return found.pop() if len(found) == 1 else None


def _split_verdict(value) -> tuple[object, str]:
    if isinstance(value, dict):
        lowered = {str(key).casefold(): item for key, item in value.items()}
        winner = next((lowered[key] for key in _WINNER_KEYS if key in lowered), None)
        reason = next((lowered[key] for key in _REASON_KEYS if key in lowered), "")
        return winner, str(reason)
    return value, ""


@dataclass
class ParsedVerdict:
    """The judge's reply read as positions: criterion -> (1 or 2, reason)."""

    positions: dict[str, tuple[int, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def parse_verdict(raw: str) -> ParsedVerdict:
    parsed = ParsedVerdict()
    data = extract_json(raw)
    if not isinstance(data, dict):
        parsed.problems.append("the reply holds no JSON object")
        return parsed
    for key, value in data.items():
        criterion = _criterion_of(key)
        if criterion is None or criterion in parsed.positions:
            continue
        winner, reason = _split_verdict(value)
        position = _position_of(winner)
        if position is None:
            parsed.problems.append(f"{criterion}: no clear winner in {str(winner)[:80]!r}")
            continue
        parsed.positions[criterion] = (position, reason.strip())
    for criterion in CRITERIA:
        if criterion not in parsed.positions and not any(p.startswith(f"{criterion}:") for p in parsed.problems):
            parsed.problems.append(f"{criterion}: missing")
    return parsed


def verdicts_for_systems(parsed: ParsedVerdict, *, order: str) -> dict[str, dict]:
    """Map positions back to systems: in order "ab" Answer 1 is system a, in "ba" it is system b."""
    first, second = order[0], order[1]
    return {
        criterion: {"winner": first if position == 1 else second, "reason": reason}
        for criterion, (position, reason) in parsed.positions.items()
    }


def win_rates(verdict_sets: list[dict[str, dict]]) -> dict[str, dict]:
    """Per criterion: wins of a and b, unreadable verdicts, and each system's share of the readable ones in percent.

    Each judgement is one vote per criterion (a pair judged in both orders gives two), as in
    the paper; a verdict the judge left unreadable counts for neither side.
    """
    rates = {}
    for criterion in CRITERIA:
        winners = [verdicts[criterion]["winner"] for verdicts in verdict_sets if criterion in verdicts]
        a, b = winners.count("a"), winners.count("b")
        total = a + b
        rates[criterion] = {
            "a_wins": a,
            "b_wins": b,
            "unreadable": len(verdict_sets) - total,
            "a_percent": round(100.0 * a / total, 1) if total else None,
            "b_percent": round(100.0 * b / total, 1) if total else None,
        }
    return rates
