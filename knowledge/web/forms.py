from django import forms

from knowledge.models import ModelEndpoint, Role, Source, Workspace
from knowledge.rag.parsing import ACCEPTED_TYPES
from knowledge.services import scopes


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    """Several files in one field. Each file is judged on its own by the upload view, so one bad
    file is reported by name instead of failing the whole form."""

    widget = MultipleFileInput

    def __init__(self, **kwargs):
        kwargs.setdefault("allow_empty_file", True)
        super().__init__(**kwargs)

    def clean(self, data, initial=None):
        files = data if isinstance(data, list | tuple) else [data]
        return [super(MultipleFileField, self).clean(item, initial) for item in files if item]


class UploadForm(forms.Form):
    files = MultipleFileField(
        required=False,
        widget=MultipleFileInput(attrs={"accept": ",".join(ACCEPTED_TYPES)}),
        help_text=(
            "PDF, Word (.docx), PowerPoint (.pptx), Excel (.xlsx), CSV, EPUB, OpenDocument (.odt), RTF, HTML, "
            "Markdown, plain text, JSON, YAML, XML, email (.eml) and source code; several at once."
        ),
    )
    title = forms.CharField(max_length=300, required=False, help_text="Title of the pasted text.")
    text = forms.CharField(widget=forms.Textarea(attrs={"rows": 8}), required=False, strip=False, label="Or paste text")
    tags = forms.CharField(
        max_length=1000,
        required=False,
        help_text="Separated by commas; a question can be scoped to them. A new version keeps its document's tags.",
    )

    def clean_tags(self):
        try:
            return scopes.parse_tags(self.cleaned_data["tags"])
        except scopes.TagsInvalid as err:
            raise forms.ValidationError(str(err)) from None

    def clean(self):
        cleaned = super().clean()
        if not cleaned.get("files") and not (cleaned.get("text") or "").strip():
            raise forms.ValidationError("Choose at least one file or paste some text.")
        return cleaned


class DocumentLabelForm(forms.Form):
    tags = forms.CharField(max_length=1000, required=False, help_text="Separated by commas.")
    enabled = forms.BooleanField(
        required=False,
        label="Questions read this document",
        help_text="A disabled document stays but is not retrieved.",
    )

    def clean_tags(self):
        try:
            return scopes.parse_tags(self.cleaned_data["tags"])
        except scopes.TagsInvalid as err:
            raise forms.ValidationError(str(err)) from None


class DocumentReplaceForm(forms.Form):
    file = forms.FileField(
        label="New version",
        widget=forms.ClearableFileInput(attrs={"accept": ",".join(ACCEPTED_TYPES)}),
        help_text=(
            "Unchanged passages keep what was extracted from them; "
            "the current version is served until this one is read."
        ),
    )


class SourceForm(forms.Form):
    name = forms.CharField(max_length=200)
    kind = forms.ChoiceField(choices=Source.Kind.choices, label="Kind")
    location = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=(
            "A folder on the server (under the folders the administrator allows); page URLs, one a line, "
            "or a sitemap's URL; a git repository's https URL or a local path."
        ),
    )
    branch = forms.CharField(max_length=200, required=False, help_text="Git only; empty: the default branch.")
    tags = forms.CharField(max_length=1000, required=False, help_text="Given to every document it brings.")
    interval_minutes = forms.IntegerField(min_value=1, max_value=7 * 24 * 60, initial=60, label="Sync every (minutes)")
    grace_hours = forms.IntegerField(
        min_value=0,
        max_value=24 * 90,
        initial=24,
        label="Keep missing documents for (hours)",
        help_text="A document whose file disappeared is removed only after this.",
    )

    def clean_tags(self):
        try:
            return scopes.parse_tags(self.cleaned_data["tags"])
        except scopes.TagsInvalid as err:
            raise forms.ValidationError(str(err)) from None


class WorkspaceCreateForm(forms.ModelForm):
    class Meta:
        model = Workspace
        fields = ["name", "description"]
        widgets = {"description": forms.Textarea(attrs={"rows": 3})}


class WorkspaceSettingsForm(forms.ModelForm):
    entity_types = forms.CharField(
        required=False,
        help_text="Comma-separated entity types the extractor looks for; empty means the defaults.",
    )

    class Meta:
        model = Workspace
        fields = ["name", "description", "chunk_token_size", "chunk_overlap_tokens", "gleaning_passes", "entity_types"]
        widgets = {"description": forms.Textarea(attrs={"rows": 3})}
        help_texts = {
            "chunk_token_size": "Tokens per chunk (LightRAG's default is 1200). Applies to documents ingested later.",
            "chunk_overlap_tokens": "Tokens shared by neighbouring chunks.",
            "gleaning_passes": "Extra LLM calls per chunk asking for missed entities (0 to 3).",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial["entity_types"] = ", ".join(self.instance.entity_types or [])
        self.fields["chunk_token_size"].min_value = 100
        self.fields["chunk_token_size"].widget.attrs.update(min=100, max=8000)
        self.fields["gleaning_passes"].widget.attrs.update(min=0, max=3)

    def clean_chunk_token_size(self):
        size = self.cleaned_data["chunk_token_size"]
        if not 100 <= size <= 8000:
            raise forms.ValidationError("Use between 100 and 8000 tokens per chunk.")
        return size

    def clean_gleaning_passes(self):
        passes = self.cleaned_data["gleaning_passes"]
        if passes > 3:
            raise forms.ValidationError("At most 3 gleaning passes.")
        return passes

    def clean_entity_types(self):
        raw = self.cleaned_data["entity_types"]
        types = []
        for part in raw.split(","):
            name = part.strip().lower()
            if name and name not in types:
                types.append(name)
        return types

    def clean(self):
        cleaned = super().clean()
        size, overlap = cleaned.get("chunk_token_size"), cleaned.get("chunk_overlap_tokens")
        if size is not None and overlap is not None and overlap >= size // 2:
            self.add_error("chunk_overlap_tokens", "The overlap must be less than half the chunk size.")
        return cleaned


class MemberAddForm(forms.Form):
    identifier = forms.CharField(label="Username or email", max_length=254)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class InviteForm(forms.Form):
    email = forms.EmailField(label="Email address", max_length=254)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


class EmailForm(forms.Form):
    email = forms.EmailField(label="Your work email", max_length=254)


class NewAccountForm(forms.Form):
    """What a person chooses for the account an invitation or a sign-up link makes: the address
    is the link's. Passwords are checked by the account service (Django's validators)."""

    username = forms.CharField(max_length=150, help_text="What you log in with (your email works too).")
    first_name = forms.CharField(max_length=150, required=False, label="First name")
    last_name = forms.CharField(max_length=150, required=False, label="Last name")
    password1 = forms.CharField(
        label="Password", strip=False, widget=forms.PasswordInput(attrs={"autocomplete": "new-password"})
    )
    password2 = forms.CharField(
        label="Password again", strip=False, widget=forms.PasswordInput(attrs={"autocomplete": "new-password"})
    )

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("password1") and cleaned.get("password1") != cleaned.get("password2"):
            self.add_error("password2", "The two passwords differ.")
        return cleaned


class NameForm(forms.Form):
    first_name = forms.CharField(max_length=150, required=False, label="First name")
    last_name = forms.CharField(max_length=150, required=False, label="Last name")


class ModelEndpointForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="How the Models page names it, e.g. “OpenAI” or “GPU box”.")
    kind = forms.ChoiceField(choices=ModelEndpoint.Kind.choices, initial=ModelEndpoint.Kind.OPENAI)
    base_url = forms.CharField(
        max_length=500,
        label="Address",
        help_text="OpenAI-compatible: the API's base, e.g. https://api.openai.com/v1. Ollama: the server, "
        "e.g. http://127.0.0.1:11434.",
    )
    api_key = forms.CharField(
        max_length=500,
        required=False,
        label="API key",
        # Never sent back to the browser, not even after a failed submission.
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Stored encrypted and never shown again. Local servers usually need none.",
    )


class ModelKeyForm(forms.Form):
    api_key = forms.CharField(
        max_length=500,
        required=False,
        label="New API key",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Empty removes the key.",
    )


class ModelPickForm(forms.Form):
    """A model of an endpoint; no endpoint means the environment's model (LLM_*, EMBEDDING_*)."""

    endpoint = forms.IntegerField(required=False)
    model = forms.CharField(max_length=200, required=False)

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("endpoint") is not None and not cleaned.get("model"):
            raise forms.ValidationError("Pick one of the endpoint's models.")
        return cleaned
