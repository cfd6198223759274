import re

import pytest

from knowledge.rag.parsing import parse_file
from knowledge.rag.sentences import sentences
from tests.knowledge.documents import HTML_PAGE, MARKDOWN_GUIDE, PDF_TEXT


def readable(source: str) -> str:
    """A span normalised as docs/asking.md ("Sentences") says: a word hyphenated across a line
    joined, whitespace collapsed."""
    return " ".join(re.sub(r"(\S*[^\W\d_])-\n(?=[a-z])", lambda m: m[1] + ("-" if "-" in m[1] else ""), source).split())


def complete(text: str, **options) -> list[str]:
    return [sentence.text for sentence in sentences(text, **options) if sentence.complete]


@pytest.mark.parametrize("text", [MARKDOWN_GUIDE, parse_file("page.html", HTML_PAGE.encode()).text, PDF_TEXT])
def test_it_gives_every_complete_sentence_its_exact_span(text):
    found = [sentence for sentence in sentences(text) if sentence.complete]

    assert len(found) > 5
    for sentence in found:
        assert readable(text[sentence.start : sentence.end]) == sentence.text


def test_it_reads_only_the_prose_of_markdown():
    assert complete(MARKDOWN_GUIDE) == [
        "Frobnicator is a command-line tool for frobnicating large files.",
        "It was written by the Acme tools team in 2019 and is maintained by Dana Whitfield.",
        "2 GB of free disk space.",
        "More is better for large inputs.",
        "Download the release archive.",
        "Unpack it with `tar xzf frob.tar.gz`.",
        "The installer copies the binary into `bin/` and writes a default configuration file.",
        "It never overwrites an existing configuration.",
        "Note: the installer needs write access to the prefix.",
        "Run it with sudo when installing system-wide.",
        "Frobnicator reads its configuration from `~/.frobrc`.",
        "The file uses the INI format, e.g. `threads = 4`.",
    ]
    every = [sentence.text for sentence in sentences(MARKDOWN_GUIDE)]
    # Headings, code, table cells and quote or list markers are never part of a sentence.
    assert not any(text.startswith(("#", "-", ">", "|", "1.")) for text in every)
    assert not any("install.sh" in text or "--prefix" in text or "Installing Frobnicator" in text for text in every)


def test_it_reads_html_documentation_without_its_navigation_listing_or_table():
    found = complete(parse_file("page.html", HTML_PAGE.encode()).text)

    assert "The dpkg command installs a local package file and never resolves dependencies." in found
    assert "Use apt for interactive package management." in found
    assert not any(word in text for text in found for word in ("Previous", "apt update", "sudo", "2.1."))


def test_it_reads_pdf_text_across_line_breaks_and_hyphens():
    found = complete(PDF_TEXT)

    assert (
        "LightRAG was developed at the University of Hong Kong by the data intelligence lab led by Chao Huang." in found
    )
    assert (
        "Existing RAG systems have significant limitations, including a reliance on flat data representations "
        "and inadequate contextual awareness." in found
    )
    # "e.g." does not end a sentence; run-in headings, captions, page numbers and table rows are not sentences.
    assert any(text.startswith("Next, we leverage LLMs") and text.endswith("between them.") for text in found)
    assert not any(
        text.startswith(("Graph-Enhanced Entity", "Table 1", "Statistics", "Total", "1 Introduction", "2.1"))
        for text in found
    )
    assert all(len(text.split()) > 5 for text in found)


def test_it_keeps_line_numbers_of_a_listing_out_of_its_sentences():
    text = "10 The parser reads the file line by line.\n11 It stops at the first blank line.\n12 Nothing else is read."

    found = sentences(text)

    assert [sentence.text for sentence in found] == [
        "The parser reads the file line by line.",
        "It stops at the first blank line.",
        "Nothing else is read.",
    ]
    assert [text[sentence.start : sentence.end] for sentence in found] == [sentence.text for sentence in found]


def test_a_chunk_cut_in_mid_sentence_does_not_begin_with_a_sentence():
    # A chunk that had to be cut inside a sentence (no boundary within the token budget) begins
    # with the space before its first word.
    chunk = PDF_TEXT[PDF_TEXT.index(" ", len(PDF_TEXT) // 3) :]

    found = sentences(chunk, clipped=True)

    assert not found[0].complete
    assert any(sentence.complete for sentence in found[1:])


def test_a_chunk_that_begins_inside_a_code_block_reads_the_prose_after_it():
    chunk = MARKDOWN_GUIDE[MARKDOWN_GUIDE.index("./install.sh") :]

    found = complete(chunk, clipped=True)

    assert found[0] == "The installer copies the binary into `bin/` and writes a default configuration file."
    assert not any("Installing into" in text for text in found)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # spaCy's sentencizer ends a sentence after the punctuation that follows its full stop.
        (
            "It returns the last item. (The brackets mean it is optional.) Then more text here.",
            ["It returns the last item.", "(The brackets mean it is optional.)", "Then more text here."],
        ),
        (
            'It is done. "Quoted start of a sentence," she said loudly.',
            ["It is done.", '"Quoted start of a sentence," she said loudly.'],
        ),
        ('He said "stop." Then he left the room quietly.', ['He said "stop."', "Then he left the room quietly."]),
    ],
)
def test_an_opening_bracket_or_quotation_mark_begins_the_sentence_it_opens(text, expected):
    found = sentences(text)

    assert [sentence.text for sentence in found] == expected
    assert all(text[sentence.start : sentence.end] == sentence.text for sentence in found)
