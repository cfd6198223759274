import pytest

from knowledge.chunking import chunk_text
from knowledge.tokens import count_tokens, encode

PROSE = " ".join(f"Sentence number {i} talks about Ada Lovelace and the Analytical Engine." for i in range(200))


def test_chunks_are_windows_of_the_configured_size_with_overlap():
    chunks = chunk_text(PROSE, size=100, overlap=20)
    tokens = encode(PROSE)

    assert all(chunk.token_count == 100 for chunk in chunks[:-1])
    assert 0 < chunks[-1].token_count <= 100
    assert len(chunks) == -(-(len(tokens) - 20) // 80)
    assert [chunk.order for chunk in chunks] == list(range(len(chunks)))


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
    assert chunks[-1].char_end == len(text)


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
