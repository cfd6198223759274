import pytest

from knowledge.rag import parsing
from knowledge.rag.chunking import chunk_text, embedding_text
from knowledge.rag.tokens import count_tokens, encode
from tests.knowledge.documents import SPHINX_PAGE, pdf_report, pptx_deck, xlsx_workbook

PROSE = " ".join(f"Sentence number {i} talks about Ada Lovelace and the Analytical Engine." for i in range(200))


def test_text_without_break_points_is_cut_in_windows_of_the_configured_size_with_overlap():
    text = " ".join(f"word{i}" for i in range(2000))
    chunks = chunk_text(text, size=100, overlap=20)
    tokens = encode(text)

    assert all(chunk.token_count == 100 for chunk in chunks[:-1])
    assert 0 < chunks[-1].token_count <= 100
    assert len(chunks) == -(-(len(tokens) - 20) // 80)
    assert [chunk.order for chunk in chunks] == list(range(len(chunks)))


def test_prose_is_cut_at_sentence_ends_within_the_size():
    chunks = chunk_text(PROSE, size=100, overlap=20)

    assert all(50 <= chunk.token_count <= 100 for chunk in chunks[:-1])
    assert all(chunk.text.endswith("Engine.") for chunk in chunks)


def test_each_chunk_is_exactly_the_document_between_its_offsets():
    chunks = chunk_text(PROSE, size=100, overlap=20)

    for chunk in chunks:
        assert PROSE[chunk.char_start : chunk.char_end] == chunk.text
    assert chunks[0].char_start == 0
    assert chunks[-1].char_end == len(PROSE)
    assert all(later.char_start < earlier.char_end for earlier, later in zip(chunks, chunks[1:], strict=False))


def test_offsets_stay_on_character_boundaries_in_non_latin_text():
    text = "東京は日本の首都です。" * 60 + " Ünïcödé 🚀 " * 40

    chunks = chunk_text(text, size=37, overlap=5)

    assert "".join(chunk.text for chunk in chunks[:1]) == text[: chunks[0].char_end]
    for chunk in chunks:
        assert text[chunk.char_start : chunk.char_end] == chunk.text
        assert "\ufffd" not in chunk.text
    assert chunks[-1].char_end == len(text.rstrip())  # edges are trimmed of whitespace


def test_a_short_text_is_one_chunk_and_an_empty_one_none():
    assert [(chunk.text, chunk.token_count) for chunk in chunk_text("Hello team.", size=1200, overlap=100)] == [
        ("Hello team.", count_tokens("Hello team."))
    ]
    assert chunk_text("", size=1200, overlap=100) == []


def test_an_overlap_as_large_as_the_chunk_still_moves_forward():
    chunks = chunk_text(PROSE, size=50, overlap=80)

    assert chunks[1].char_start > chunks[0].char_start


def test_a_chunk_size_below_one_is_refused():
    with pytest.raises(ValueError, match="at least one token"):
        chunk_text(PROSE, size=0, overlap=0)


SECTIONED = (
    "# Guide\n\nThe guide explains the product.\n\n"
    "## Install\n\n" + "Run the installer and follow the prompts on the screen. " * 30 + "\n\n"
    "## Configure\n\n" + "Set the variables in the environment before the first start. " * 30 + "\n\n"
    "### Database\n\n" + "Point DATABASE_URL at a Postgres server with pgvector installed. " * 10
)


def test_every_chunk_carries_the_exact_heading_path_of_its_section():
    parsed = parsing.parse_file("guide.md", SECTIONED.encode())

    chunks = chunk_text(parsed.text, size=200, overlap=20, sections=parsed.sections)

    assert [chunk.section for chunk in chunks] == [
        "Guide > Install",
        "Guide > Install",
        "Guide > Configure",
        "Guide > Configure",
        "Guide > Configure > Database",
    ]
    assert [chunk.anchor for chunk in chunks] == ["section-2", "section-2", "section-3", "section-3", "section-4"]


def test_a_chunk_ends_at_a_section_start_and_the_next_starts_there_without_overlap():
    parsed = parsing.parse_file("guide.md", SECTIONED.encode())

    chunks = chunk_text(parsed.text, size=200, overlap=20, sections=parsed.sections)

    starts = {section.start for section in parsed.sections}
    assert chunks[2].char_start in starts
    assert chunks[2].text.startswith("## Configure")
    assert chunks[4].text.startswith("### Database")
    assert chunks[1].char_end <= chunks[2].char_start
    for chunk in chunks:
        assert parsed.text[chunk.char_start : chunk.char_end] == chunk.text
        assert chunk.token_count <= 200


def test_without_sections_a_chunk_prefers_to_end_at_a_paragraph():
    text = "\n\n".join(f"Paragraph {i}. " + "Words of the paragraph go on. " * 8 for i in range(20))

    chunks = chunk_text(text, size=150, overlap=0)

    assert all(chunk.text.endswith("go on.") for chunk in chunks)
    assert all(chunk.text.startswith("Paragraph") for chunk in chunks)


def test_pdf_chunks_carry_their_pages_and_a_label():
    parsed = parsing.parse_file("report.pdf", pdf_report())

    chunks = chunk_text(parsed.text, size=20, overlap=0, sections=parsed.sections, regions=parsed.regions)

    dual = next(chunk for chunk in chunks if "Dual-level retrieval uses" in chunk.text)
    assert (dual.page_start, dual.page_end, dual.location, dual.anchor) == (2, 2, "p. 2", "page-2")
    assert dual.section == "2 Method > 2.3 Dual-level retrieval"
    whole = chunk_text(parsed.text, size=1200, overlap=0, sections=parsed.sections, regions=parsed.regions)
    assert [(chunk.page_start, chunk.page_end, chunk.location) for chunk in whole] == [(1, 3, "pp. 1-3")]


def test_slides_and_sheets_get_their_labels():
    deck = parsing.parse_file("deck.pptx", pptx_deck())
    sheets = parsing.parse_file("finance.xlsx", xlsx_workbook())

    slide_chunks = chunk_text(deck.text, size=12, overlap=0, sections=deck.sections, regions=deck.regions)
    sheet_chunks = chunk_text(sheets.text, size=1200, overlap=0, sections=sheets.sections, regions=sheets.regions)

    assert slide_chunks[-1].location == "slide 2"
    assert slide_chunks[-1].anchor == "slide-2"
    assert [chunk.location for chunk in sheet_chunks] == ["sheets Revenue, Costs"]


def test_the_section_path_is_embedded_with_the_text():
    assert embedding_text("Guide > Install", "Run it.") == "Guide > Install\n\nRun it."
    assert embedding_text("", "Run it.") == "Run it."


def test_a_documentation_pages_navigation_never_reaches_a_chunk():
    parsed = parsing.parse_file("sorting.html", SPHINX_PAGE.encode())

    chunks = chunk_text(parsed.text, size=40, overlap=5, sections=parsed.sections)

    assert len(chunks) > 3
    for chunk in chunks:
        for boilerplate in ("Previous topic", "Next topic", "Quick search", "Table of Contents", "Copyright"):
            assert boilerplate not in chunk.text
