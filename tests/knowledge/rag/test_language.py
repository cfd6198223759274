"""The language registry (knowledge/rag/language.py): which entry reads a text, and how each reads it."""

import re
import threading

import numpy as np
import pytest
from django.db import connection

from knowledge.rag import language
from knowledge.rag.answer.reading import content_terms
from knowledge.rag.extraction.rules import nlp_extract
from knowledge.rag.retrieval.history import is_follow_up
from knowledge.rag.retrieval.keywords import nlp_keywords
from knowledge.rag.retrieval.searches import chunks_nearest, entities_nearest, identifier_terms, search_terms
from knowledge.rag.sentences import sentences
from knowledge.services.workspaces import workspace_refresh_counts
from tests.factories import make_chunk, make_document, make_entity, random_vector
from tests.knowledge.documents import FRENCH_TEXT, JAPANESE_TEXT

TYPES = ["person", "organization", "location", "product", "concept"]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("What does inspect.get_annotations do?", "en"),
        ("Why?", "en"),  # too short to tell: read as English, as everything was before
        ("Wie funktioniert das?", "en"),  # German has no entry: read as English
        ("LightRAGの二段階検索とは何ですか？", "ja"),
        ("なぜ？", "ja"),
        ("香港大学", "ja"),  # ideographs alone are Chinese to the detector, read with Japanese rules
        ("Comment fonctionne la recherche à deux niveaux ?", "fr"),
        ("Quel est le prix ?", "fr"),
        ("", "en"),
    ],
)
def test_each_text_is_read_by_the_entry_of_its_language(text, code):
    assert language.of(text).code == code


def test_it_names_the_language_of_a_document_even_without_an_entry():
    assert language.detect(JAPANESE_TEXT) == "ja"
    assert language.detect(FRENCH_TEXT) == "fr"
    assert language.detect("Das Protokoll wird täglich um Mitternacht rotiert und eine Woche lang aufbewahrt.") == "de"
    assert language.detect("12 + 30 = 42") == ""


def test_japanese_terms_are_its_content_words_and_latin_words_are_read_as_english():
    assert content_terms("LightRAGの二段階検索とは何ですか？") == {"lightrag", "段階", "検索"}
    assert content_terms("低レベルのキーワードを使う。") == {"低", "レベル", "キーワード", "使う"}
    # A Latin word inside Japanese meets the same word in an English sentence.
    assert content_terms("LightRAG uses graphs.") & content_terms("LightRAGはグラフを使う。") == {"lightrag"}


def test_options_and_long_numbers_are_terms_as_written_in_every_language():
    manual = content_terms("-H, --si: 1000 の累乗でサイズを表示する")
    assert {"-H", "--si", "1000"} <= manual
    assert "1000" in manual & content_terms("Which option shows sizes in powers of 1000?")
    assert "-i" in content_terms("dfの-iオプションは何を表示しますか？") & content_terms("-i, --inodes")
    assert content_terms("sort -M") == {"sort", "-M"}
    # Hyphenated words, dashes, negative numbers and kanji counters are not.
    assert content_terms("non-empty lists -- e.g. -1") == {"non", "list"}
    assert content_terms("二段階") == {"段階"}


def test_english_and_french_terms_are_stemmed_by_their_own_stemmer():
    assert content_terms("The parser uses tokens") == content_terms("parsers use the token")
    assert content_terms("les recherches dans les graphes") == {"recherch", "graph"}


def test_japanese_sentences_end_at_their_own_marks_but_not_inside_a_quotation():
    text = "LightRAGは香港大学で開発された。グラフを\n使って検索する！「これは引用です。」と彼は言った。本当？"

    found = sentences(text)

    assert [sentence.text for sentence in found] == [
        "LightRAGは香港大学で開発された。",
        "グラフを使って検索する！",
        "「これは引用です。」と彼は言った。",
        "本当？",
    ]
    assert [sentence.complete for sentence in found] == [True, True, True, False]
    assert [language.collapse_whitespace(text[s.start : s.end]) for s in found] == [s.text for s in found]


def test_a_japanese_text_yields_japanese_entities_and_relations():
    (records,) = nlp_extract([JAPANESE_TEXT], entity_types=TYPES)

    types = {entity["name"]: entity["type"] for entity in records["entities"]}
    assert {"LightRAG", "香港大学", "二段階検索", "Microsoft"} <= set(types)
    assert types["Microsoft"] == "organization"
    pairs = {frozenset((relation["source"], relation["target"])) for relation in records["relations"]}
    assert {frozenset(("LightRAG", "香港大学")), frozenset(("LightRAG", "二段階検索"))} <= pairs
    # Relations are described by their sentence, as written: no spaces put into Japanese.
    assert "二段階検索はLightRAGの中心的な仕組みである。" in {
        relation["description"] for relation in records["relations"]
    }


def test_a_french_text_yields_french_entities():
    (records,) = nlp_extract([FRENCH_TEXT], entity_types=TYPES)

    types = {entity["name"]: entity["type"] for entity in records["entities"]}
    assert types.get("Marie Curie") == "person"
    assert types.get("Paris") == "location"


def test_a_japanese_question_gets_japanese_keywords():
    keywords = nlp_keywords("LightRAGの二段階検索とは何ですか？")

    assert keywords.low_level == ("LightRAG", "二段階検索")


def _at_once(call, threads: int = 4, rounds: int = 40) -> list[BaseException]:
    """Runs `call` on `threads` threads released together, `rounds` times; the errors raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def run() -> None:
        for _ in range(rounds):
            barrier.wait()
            try:
                call()
            except Exception as error:  # collected for the assertion
                errors.append(error)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return errors


def test_questions_read_on_many_threads_at_once_each_get_their_keywords():
    question = "LightRAGの二段階検索とは何ですか？香港大学の研究室は何を開発しましたか？"
    # The race is real: GiNZA's pipeline itself, called by threads at once, fails.
    unguarded = language._pipeline(language.JAPANESE.spacy_model)
    assert any("Already borrowed" in str(error) for error in _at_once(lambda: unguarded(question)))

    found = []
    assert _at_once(lambda: found.append(nlp_keywords(question).low_level)) == []
    assert set(found) == {("LightRAG", "二段階検索", "香港大学", "研究室")}
    assert len(found) == 4 * 40


@pytest.mark.parametrize(
    ("question", "follows"),
    [
        ("LightRAGの二段階検索とは何ですか？", False),
        ("香港大学の研究室は何を開発しましたか？", False),
        ("それはいつ発表されましたか？", True),
        ("その価格は？", True),
        ("なぜ？", True),
        ("では、GraphRAGは？", True),
        ("Qui a fondé Acme ?", False),
        ("Quel est son prix ?", True),
        ("Et pourquoi ?", True),
        ("Y a-t-il une limite de jetons ?", False),
    ],
)
def test_follow_ups_are_told_by_the_rules_of_the_questions_language(question, follows):
    assert is_follow_up(question) is follows


@pytest.mark.django_db
def test_python_and_postgres_cut_the_same_characters_into_pairs():
    """CJK_CHARACTERS (Python) and cjk_bigrams (SQL, migration 0009) must agree on every edge of
    every range, or a query term and the text it should find would be cut differently."""
    ranges = re.findall(r"(.)-(.)", language.CJK_CHARACTERS)
    edges = sorted({ord(character) for pair in ranges for character in pair})
    probes = [chr(point + offset) for point in edges for offset in (-1, 0, 1)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT cjk_bigrams(probe) FROM unnest(%s::text[]) AS probe", [[f"a{c}{c}b" for c in probes]])
        cut = [row[0] for row in cursor.fetchall()]
    for character, text in zip(probes, cut, strict=True):
        pair = character * 2
        assert text == (f"a {pair} b" if language.CJK_RUN.fullmatch(character) else f"a{pair}b"), hex(ord(character))


def test_a_query_term_in_japanese_is_cut_off_from_the_words_around_it():
    assert identifier_terms("LightRAGの二段階検索とは何ですか？") == "'lightrag'"
    assert search_terms("LightRAGの手法") == "'lightrag' | 'の手法'"


@pytest.mark.django_db
def test_full_text_search_finds_words_inside_japanese_text(workspace):
    rng = np.random.default_rng(8)
    query = random_vector(rng)
    document = make_document(workspace, text=JAPANESE_TEXT)
    make_chunk(document, order=0, text="グラフ構造を用いて文書から知識を抽出する。", embedding=random_vector(rng))
    answering = make_chunk(document, order=1, text="二段階検索はLightRAGの仕組みである。", embedding=random_vector(rng))
    whole = make_entity(workspace, "二段階検索", embedding=random_vector(rng))
    make_entity(workspace, "検索拡張生成", embedding=random_vector(rng))
    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()
    # No vector is that near the query: whatever is found, the words found.
    words_only = {"workspace": workspace, "vector": query, "k": 5, "min_similarity": 0.99}

    chunks = chunks_nearest(text="LightRAGの二段階検索とは何ですか？", **words_only)

    assert [chunk.pk for chunk in chunks] == [answering.pk]
    # "段階検索" is inside "二段階検索"; "生成検索" is inside nothing, though its characters are.
    assert [entity.pk for entity in entities_nearest(names=["段階検索"], **words_only)] == [whole.pk]
    assert entities_nearest(names=["生成検索"], **words_only) == []
