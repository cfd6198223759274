from dataclasses import dataclass

from django import forms

from knowledge.rag.answer import DEFAULT_RESPONSE_TYPE, answer_is_extractive
from knowledge.rag.retrieval import DEFAULT_CHUNK_TOP_K, DEFAULT_MODE, DEFAULT_TOP_K
from knowledge.rag.retrieval import MODES as RETRIEVAL_MODES
from knowledge.services.asking import QUESTION_MAX_CHARS, TOP_K_MAX, AskInvalid, AskRequest, ask_request


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
# Modes that answer nothing without a chat model: bypass sends the question to the model alone.
MODES_NEEDING_A_MODEL = {"bypass": "Needs a chat model: connect one on the Models page (/models/)."}
RESPONSE_TYPES = ["Multiple Paragraphs", "Single Paragraph", "Bullet Points", "Single Sentence"]
# Naive retrieval searches passages only and bypass retrieves nothing: every other mode walks the graph.
GRAPH_MODES = {mode for mode in RETRIEVAL_MODES if mode not in {"naive", "bypass"}}


@dataclass(frozen=True)
class Setting:
    name: str
    # Why it is not shown in the current mode; empty when it is shown.
    unused: str = ""


def answer_settings(*, mode: str, extractive: bool) -> list[Setting]:
    """The settings that change something for this mode and this way of answering, each with the
    reason it is left out when it does not: the page shows only these, and asks with only these."""
    return [
        Setting(
            "response_type",
            "Answer as: only a chat model writes in a form; extractive answers are the sources' sentences."
            if extractive
            else "",
        ),
        Setting("top_k", "" if mode in GRAPH_MODES else f"Graph rows: {EXPLANATIONS[mode][0]} reads no graph."),
        Setting("chunk_top_k", "Passages: Bypass retrieves nothing." if mode == "bypass" else ""),
    ]


def _count_field(name: str) -> forms.IntegerField:
    message = f"{name} must be between 1 and {TOP_K_MAX}."
    return forms.IntegerField(
        required=False,
        min_value=1,
        max_value=TOP_K_MAX,
        error_messages={"min_value": message, "max_value": message, "invalid": message},
    )


class AnswerSettingsForm(forms.Form):
    """How to answer: the mode, how much to retrieve and the form of the answer. Blank values take
    the defaults; a mode that needs a chat model is refused when none is configured."""

    mode = forms.ChoiceField(
        choices=[(mode.value, mode.label) for mode in MODES],
        required=False,
        error_messages={"invalid_choice": f"Unknown mode; choose one of {', '.join(MODE_VALUES)}."},
    )
    top_k = _count_field("top_k")
    chunk_top_k = _count_field("chunk_top_k")
    response_type = forms.ChoiceField(
        choices=[(value, value) for value in RESPONSE_TYPES],
        required=False,
        error_messages={"invalid_choice": f"Choose an answer form: {', '.join(RESPONSE_TYPES)}."},
    )

    def clean_mode(self) -> str:
        mode = self.cleaned_data.get("mode") or DEFAULT_MODE
        if mode in MODES_NEEDING_A_MODEL and answer_is_extractive():
            raise forms.ValidationError(f"{EXPLANATIONS[mode][0]}: {MODES_NEEDING_A_MODEL[mode]}")
        return mode

    def clean_top_k(self) -> int:
        return self.cleaned_data.get("top_k") or DEFAULT_TOP_K

    def clean_chunk_top_k(self) -> int:
        return self.cleaned_data.get("chunk_top_k") or DEFAULT_CHUNK_TOP_K

    def clean_response_type(self) -> str:
        return self.cleaned_data.get("response_type") or DEFAULT_RESPONSE_TYPE

    def first_error(self) -> str:
        for errors in self.errors.values():
            return errors[0]
        return ""


class _Checked(forms.Field):
    """The values of same-named checkboxes as htmx's websocket extension sends them: left out when
    none is ticked, a string for one, a list for several."""

    def to_python(self, value) -> list[str]:
        if value in (None, ""):
            return []
        return [str(item) for item in value] if isinstance(value, list) else [str(value)]


class AskForm(AnswerSettingsForm):
    """A question from the chat page's form, as htmx's websocket extension sends it: every value a
    string, the settings not shown on the page left out (they take their defaults), the scope
    picker's ticked tags and documents (templates/chat/_scope_picker.html)."""

    question = forms.CharField(max_length=QUESTION_MAX_CHARS, error_messages={"required": "Type a question first."})
    conversation = forms.IntegerField(required=False, min_value=1)
    scope_tag = _Checked(required=False)
    scope_document = _Checked(required=False)

    def clean_scope_document(self) -> list[int]:
        ids = self.cleaned_data["scope_document"]
        if not all(pk.isdigit() for pk in ids):
            raise forms.ValidationError("Pick documents from the scope list.")
        return [int(pk) for pk in ids]

    def ask_request(self) -> tuple[AskRequest, int | None]:
        """The validated request and the conversation it continues; AskInvalid says what is wrong."""
        if not self.is_valid():
            raise AskInvalid(self.first_error())
        data = self.cleaned_data
        settings = {name: data[name] for name in ("question", "mode", "top_k", "chunk_top_k", "response_type")}
        scope = {"tags": data["scope_tag"], "documents": data["scope_document"]}
        return ask_request(**settings, filters=scope), data["conversation"]


class RenameForm(forms.Form):
    title = forms.CharField(max_length=200, strip=True)
