"""Measuring the product: the paper's LLM-judged win rates, and retrieval recall on corpora with known facts.

- questions: an evaluation set imagined for a corpus (describe it, imagine users, tasks, questions).
- systems: the systems under test: every retrieval mode plus HyDE and RQ-RAG-style decomposition.
- judging: the judge's prompt, tolerant reading of its verdicts, and win-rate arithmetic.
- runs: an evaluation run end to end (answer with both systems, judge each pair twice, summarize).
- recall: retrieval quality against a synthetic corpus, without any judge.
"""

from knowledge.rag.retrieval import MODES

SYSTEMS = (*MODES, "hyde", "rqrag")
SYSTEM_LABELS = {
    "mix": "LightRAG (mix)",
    "hybrid": "LightRAG (hybrid)",
    "local": "LightRAG (local)",
    "global": "LightRAG (global)",
    "naive": "NaiveRAG",
    "bypass": "No retrieval",
    "hyde": "HyDE",
    "rqrag": "RQ-RAG",
}
