import pytest

from chat.rendering import render_answer


@pytest.mark.parametrize(
    "markup",
    [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        '<a href="javascript:alert(1)">click</a>',
        "<iframe src=https://evil.example></iframe>",
        '<div style="background:url(javascript:alert(1))">x</div>',
        "<svg onload=alert(1)>",
    ],
)
def test_it_shows_raw_html_in_an_answer_as_text(markup):
    html = render_answer(f"Before {markup} after")

    assert "<script" not in html
    assert "<img" not in html
    assert "<iframe" not in html
    assert "<svg" not in html
    assert "<div" not in html
    assert "<a " not in html
    assert "&lt;" in html


@pytest.mark.parametrize(
    "link",
    [
        "[x](javascript:alert(1))",
        "[x](JaVaScRiPt:alert(1))",
        "[x](vbscript:msgbox(1))",
        "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
        "[x]( javascript:alert(1))",
        "<javascript:alert(1)>",
    ],
)
def test_it_drops_links_that_are_not_http_https_or_mailto(link):
    html = render_answer(link)

    assert "<a " not in html


def test_it_keeps_safe_links_and_marks_them_nofollow():
    html = render_answer("[docs](https://example.com/a?b=1) and [mail](mailto:team@example.com)")

    assert '<a href="https://example.com/a?b=1" rel="noopener noreferrer nofollow">docs</a>' in html
    assert '<a href="mailto:team@example.com" rel="noopener noreferrer nofollow">mail</a>' in html


def test_it_drops_images_so_answers_cannot_call_out_to_other_hosts():
    html = render_answer("![tracker](https://evil.example/pixel.png)")

    assert "<img" not in html


def test_it_renders_markdown():
    html = render_answer("# Title\n\n- **bold** and *em*\n- `code`\n\n| a | b |\n|---|---|\n| 1 | 2 |")

    assert "<h1>Title</h1>" in html
    assert "<strong>bold</strong>" in html
    assert "<em>em</em>" in html
    assert "<code>code</code>" in html
    assert "<td>1</td>" in html


def test_it_links_citation_markers_to_their_rows():
    html = render_answer("Ada wrote it [S2]. Babbage built it [E1, R3].")

    assert '<a href="#cite-S2" class="cite" data-cite="S2"' in html
    assert 'data-cite="E1"' in html
    assert 'data-cite="R3"' in html
    assert ">[S2]</a>" in html


def test_it_leaves_citation_markers_in_code_alone():
    html = render_answer("Write `[S2]` to cite.")

    assert "<code>[S2]</code>" in html
    assert "data-cite" not in html
