from dataclasses import dataclass

from django import forms

from knowledge.retrieval import MODES as RETRIEVAL_MODES


@dataclass(frozen=True)
class Mode:
    value: str
    label: str
    explanation: str


EXPLANATIONS = {
    "mix": ("Mix", "Graph (entities and relations) plus a direct search of the passages; the best default."),
    "hybrid": ("Hybrid", "Specific entities and broad themes from the graph, with their source passages."),
    "local": ("Local", "Specific entities that match the question, and their direct neighbours."),
    "global": ("Global", "Broad themes: relations that match the question, and the entities they join."),
    "naive": ("Naive", "Passages most similar to the question, without the graph (classic RAG)."),
    "bypass": ("Bypass", "No retrieval: the question goes to the model as it is."),
}
# Retrieval owns the list of modes; a mode added there without an explanation here fails at import.
MODES = [Mode(value, *EXPLANATIONS[value]) for value in RETRIEVAL_MODES]


class RenameForm(forms.Form):
    title = forms.CharField(max_length=200, strip=True)
