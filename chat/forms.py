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
MODE_VALUES = [mode.value for mode in MODES]
DEFAULT_MODE = "mix"
QUESTION_MAX_CHARS = 4000
TOP_K_MAX = 200


class AskForm(forms.Form):
    """The `ask` message of the chat websocket (DESIGN.md, "The websocket protocol")."""

    question = forms.CharField(
        max_length=QUESTION_MAX_CHARS,
        strip=True,
        error_messages={
            "required": "Type a question first.",
            "max_length": f"That question is too long; keep it under {QUESTION_MAX_CHARS} characters.",
        },
    )
    mode = forms.ChoiceField(
        choices=[(mode.value, mode.label) for mode in MODES],
        required=False,
        error_messages={"invalid_choice": f"Unknown mode; choose one of {', '.join(MODE_VALUES)}."},
    )
    conversation = forms.IntegerField(required=False, min_value=1)
    top_k = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=TOP_K_MAX,
        error_messages={
            "min_value": f"top_k must be between 1 and {TOP_K_MAX}.",
            "max_value": f"top_k must be between 1 and {TOP_K_MAX}.",
        },
    )

    def clean_mode(self) -> str:
        return self.cleaned_data.get("mode") or DEFAULT_MODE

    def first_error(self) -> str:
        for errors in self.errors.values():
            return errors[0]
        return ""


class RenameForm(forms.Form):
    title = forms.CharField(max_length=200, strip=True)
