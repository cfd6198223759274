"""Small real documents for the tests: files made with each format's own writer (parsing and
ingestion), and real-looking text for the sentence splitter and extractive answers: Markdown
documentation with headings, lists, code, a table and a quote; an HTML documentation page (with
navigation, a numbered listing and a table) that the parser turns into text; and text as pypdf
extracts it from a paper (hard line breaks, hyphenation, page numbers, run-in headings, a
flattened table); and short texts in Japanese and French for the language pipelines."""

import io

SPHINX_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Sorting HOW TO &#8212; Python 3.11 documentation</title>
<link rel="stylesheet" href="../_static/pydoctheme.css"></head>
<body>
<div class="related" role="navigation" aria-label="related navigation"><h3>Navigation</h3>
<ul><li><a href="../genindex.html">index</a></li><li><a href="../py-modindex.html">modules</a> |</li>
<li><a href="sockets.html">next</a> |</li><li><a href="regex.html">previous</a> |</li>
<li><a href="index.html">Python HOWTOs</a> &#187;</li></ul></div>
<div class="document"><div class="documentwrapper"><div class="bodywrapper">
<div class="body" role="main">
<section id="sorting-how-to"><h1>Sorting HOW TO<a class="headerlink" href="#sorting-how-to">¶</a></h1>
<p>Python lists have a built-in <code>list.sort()</code> method that modifies the list in-place. There is also a
<code>sorted()</code> built-in function that builds a new sorted list from an iterable.</p>
<p>In this document, we explore the various techniques for sorting data using Python, from the simplest
ascending sort to sorts on several keys, and the guarantees that make them composable.</p>
<section id="sorting-basics"><h2>Sorting Basics<a class="headerlink" href="#sorting-basics">¶</a></h2>
<p>A simple ascending sort is very easy: just call the <code>sorted()</code> function. It returns a new sorted
list and leaves the original alone, which is usually what a program wants.</p>
<div class="highlight-pycon3"><div class="highlight"><pre>&gt;&gt;&gt; sorted([5, 2, 3, 1, 4])
[1, 2, 3, 4, 5]
</pre></div></div>
<table class="docutils"><thead><tr><th>Function</th><th>Purpose</th></tr></thead>
<tbody><tr><td>sorted()</td><td>Builds a new sorted list</td></tr>
<tr><td>list.sort()</td><td>Sorts the list in place</td></tr></tbody></table>
<section id="key-functions"><h3>Key Functions<a class="headerlink" href="#key-functions">¶</a></h3>
<p>Both <code>list.sort()</code> and <code>sorted()</code> have a key parameter to specify a function to be
called on each list element prior to making comparisons, such as a case-insensitive comparison.</p>
</section></section>
<section id="odds-and-ends"><h2>Odds and Ends<a class="headerlink" href="#odds-and-ends">¶</a></h2>
<ul><li><p>For locale aware sorting, use <code>locale.strxfrm()</code> for a key function.</p></li>
<li><p>The reverse parameter still maintains sort stability.</p></li></ul>
</section></section>
<div class="clearer"></div></div></div></div>
<div class="sphinxsidebar" role="navigation" aria-label="main navigation"><div class="sphinxsidebarwrapper">
<div><h3><a href="../contents.html">Table of Contents</a></h3><ul><li><a href="#">Sorting HOW TO</a><ul>
<li><a href="#sorting-basics">Sorting Basics</a></li>
<li><a href="#odds-and-ends">Odds and Ends</a></li></ul></li></ul></div>
<div><h4>Previous topic</h4><p class="topless"><a href="regex.html">Regular Expression HOWTO</a></p></div>
<div><h4>Next topic</h4><p class="topless"><a href="sockets.html">Socket Programming HOWTO</a></p></div>
<div role="note" aria-label="source link"><h3>This Page</h3><ul class="this-page-menu">
<li><a href="../bugs.html">Report a Bug</a></li><li><a href="../_sources/howto/sorting.rst.txt">Show Source</a></li>
</ul></div>
<div id="searchbox" role="search"><h3>Quick search</h3><form class="search" action="../search.html" method="get">
<input type="text" name="q"><input type="submit" value="Go"></form></div>
</div></div><div class="clearer"></div></div>
<div class="related" role="navigation" aria-label="related navigation"><h3>Navigation</h3>
<ul><li><a href="../genindex.html">index</a></li><li><a href="../py-modindex.html">modules</a> |</li>
<li><a href="sockets.html">next</a> |</li><li><a href="regex.html">previous</a> |</li></ul></div>
<div class="footer">&copy; <a href="../copyright.html">Copyright</a> 2001-2023, Python Software Foundation.
<br>This page is licensed under the Python Software Foundation License Version 2.
<br>Last updated on Mar 13, 2023.</div>
</body></html>"""


def pdf_report() -> bytes:
    """Three pages with an outline: 1 Introduction (p. 1), 2 Method (p. 2) with 2.3 Dual-level
    retrieval (further down p. 2), 3 Results (p. 3)."""
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer)
    pages = [
        [("1 Introduction", 0), "Graphs help retrieval find related facts."],
        [("2 Method", 0), "The method has several steps.", ("2.3 Dual-level retrieval", 1),
         "Dual-level retrieval uses two kinds of keywords."],
        [("3 Results", 0), "The results beat the baselines on every corpus."],
    ]  # fmt: skip
    for number, lines in enumerate(pages, 1):
        y = 760
        for index, line in enumerate(lines):
            if isinstance(line, tuple):
                title, level = line
                key = f"p{number}-{index}"
                pdf.bookmarkHorizontal(key, 0, y + 14)
                pdf.addOutlineEntry(title, key, level=level)
                line = title
            pdf.drawString(72, y, line)
            y -= 24
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def text_pdf(text: str) -> bytes:
    """A one-page PDF written by hand (no library), with a Helvetica text layer."""
    content = f"BT /F1 12 Tf 20 100 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = io.BytesIO(), []
    out.write(b"%PDF-1.4\n")
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def pptx_deck() -> bytes:
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[1])
    first.shapes.title.text = "Welcome"
    first.placeholders[1].text = "GraphRAG Teams turns documents into a graph."
    second = deck.slides.add_slide(deck.slide_layouts[1])
    second.shapes.title.text = "Roadmap"
    second.placeholders[1].text = "Ship the graph view"
    table = second.shapes.add_table(2, 2, Inches(1), Inches(4), Inches(4), Inches(1)).table
    for (row, column), value in {(0, 0): "Quarter", (0, 1): "Goal", (1, 0): "Q1", (1, 1): "Beta"}.items():
        table.cell(row, column).text = value
    second.notes_slide.notes_text_frame.text = "Ask about budgets."
    buffer = io.BytesIO()
    deck.save(buffer)
    return buffer.getvalue()


def xlsx_workbook() -> bytes:
    import datetime

    import openpyxl

    workbook = openpyxl.Workbook()
    revenue = workbook.active
    revenue.title = "Revenue"
    revenue.append(["Region", "Revenue", "Booked"])
    revenue.append(["North", 120, datetime.date(2024, 3, 1)])
    revenue.append(["South", 95.5, datetime.date(2024, 3, 2)])
    costs = workbook.create_sheet("Costs")
    costs.append(["Item", "Cost"])
    costs.append(["Servers", 80.5])
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


def epub_book() -> bytes:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("graphs-1")
    book.set_title("A Book of Graphs")
    book.set_language("en")
    one = epub.EpubHtml(title="Nodes", file_name="one.xhtml", lang="en")
    one.content = (
        "<html><body><h1>Chapter 1 Nodes</h1><p>Graphs are everywhere.</p>"
        "<h2>1.1 Degrees</h2><p>A degree counts edges.</p></body></html>"
    )
    two = epub.EpubHtml(title="Edges", file_name="two.xhtml", lang="en")
    two.content = "<html><body><h1>Chapter 2 Edges</h1><p>Edges join nodes.</p></body></html>"
    book.add_item(one)
    book.add_item(two)
    book.toc = [one, two]
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", one, two]
    buffer = io.BytesIO()
    epub.write_epub(buffer, book)
    return buffer.getvalue()


def odt_document() -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.text import H, List, ListItem, P

    document = OpenDocumentText()
    document.text.addElement(H(outlinelevel=1, text="Meeting notes"))
    document.text.addElement(P(text="We agreed on the plan."))
    document.text.addElement(H(outlinelevel=2, text="Budget"))
    items = List()
    for name in ("Servers", "Licences"):
        item = ListItem()
        item.addElement(P(text=name))
        items.addElement(item)
    document.text.addElement(items)
    buffer = io.BytesIO()
    document.write(buffer)
    return buffer.getvalue()


MARKDOWN_GUIDE = """\
# Installing Frobnicator

Frobnicator is a command-line tool for frobnicating large files. It was written by
the Acme tools team in 2019 and is maintained by Dana Whitfield.

## Requirements

- Python 3.11 or newer
- A POSIX shell
- 2 GB of free disk space. More is better for large inputs.

## Steps

1. Download the release archive.
2. Unpack it with `tar xzf frob.tar.gz`.
3. Run the installer:

```sh
./install.sh --prefix /usr/local
# Installing into /usr/local.
```

The installer copies the binary into `bin/` and writes a default configuration file.
It never overwrites an existing configuration.

| Option | Default | Meaning |
|--------|---------|---------|
| --prefix | /usr/local | Where to install. |
| --quiet | off | Print nothing. |

> Note: the installer needs write access to the prefix.
> Run it with sudo when installing system-wide.

Frobnicator reads its configuration from `~/.frobrc`. The file uses the INI format, e.g. `threads = 4`.
"""

HTML_PAGE = """\
<html><head><title>Debian Reference: Package management</title><style>body{}</style></head><body>
<div class="navheader"><table><tr><td>Previous</td><td>Up</td><td>Next</td></tr></table></div>
<h1>Chapter 2. Debian package management</h1>
<h2>2.1. Debian package management prerequisites</h2>
<p>Debian is a volunteer organization which builds consistent distributions of pre-compiled binary packages of
free software and distributes them from its archive. The Debian archive is offered by many remote mirror sites
for access through HTTP and FTP methods.</p>
<p>The apt-get command was the first tool to handle dependencies. The aptitude command was created later and
offers a full-screen interactive interface. The apt command was introduced in Debian 8 (Jessie) as a
friendlier front end for interactive use.</p>
<h3>2.1.1. Package configuration</h3>
<ul>
<li>Use apt for interactive package management.</li>
<li>Use apt-get and apt-cache in scripts.</li>
<li>pin packages carefully</li>
</ul>
<p>Package configuration is stored in /etc/apt/sources.list and in files under /etc/apt/sources.list.d/. Each
line names an archive, a suite and its components.</p>
<pre class="screen">
 1  $ sudo apt update
 2  $ sudo apt install foo
 3  $ apt-cache policy foo
</pre>
<table><tr><th>command</th><th>action</th></tr>
<tr><td>apt update</td><td>update package archive metadata</td></tr>
<tr><td>apt install foo</td><td>install candidate version of "foo" package with its dependencies</td></tr>
</table>
<h2>2.2. Basic package management operations</h2>
<p>Repository-based package management operations on the Debian system can be performed by many package
management tools available on the Debian system. The apt-get command removes a package with the remove
subcommand, and the purge subcommand also deletes its configuration files.</p>
<p>The dpkg command installs a local package file and never resolves dependencies. Unlike apt, dpkg works only
on packages already downloaded to the system.</p>
<div class="navfooter">Previous | Up | Next | Home</div>
</body></html>
"""

PDF_TEXT = """\
LightRAG: Simple and Fast Retrieval-Augmented Generation
Zirui Guo, Lianghao Xia, Yanhua Yu, Tu Ao, Chao Huang
University of Hong Kong
Abstract
Retrieval-Augmented Generation (RAG) systems enhance large language models (LLMs)
by integrating external knowledge sources. Existing RAG systems have significant lim-
itations, including a reliance on flat data representations and inadequate contextual
awareness. To address these challenges, we propose LightRAG, which incorporates graph
structures into text indexing and retrieval processes.
1
1 Introduction
Retrieval-Augmented Generation systems have been developed to enhance large language
models by integrating external knowledge sources. LightRAG was developed at the Uni-
versity of Hong Kong by the data intelligence lab led by Chao Huang. The framework
employs a dual-level retrieval system that enhances comprehensive information retrieval
from both low-level and high-level knowledge discovery.
2 Retrieval-Augmented Generation
2.1 Graph-based Text Indexing
Graph-Enhanced Entity and Relationship Extraction. Our LightRAG enhances the retrieval
system by segmenting documents into smaller and more manageable pieces. This strategy
allows for quick identification and access to pertinent information without analyzing
entire documents. Next, we leverage LLMs to identify and extract various entities (e.g.,
names, dates, locations, and events) along with the relationships between them.
Table 1: Statistics of the four datasets.
Statistics Agriculture CS Legal Mix
Total Documents 12 10 94 61
Total Tokens 2,017,886 2,306,535 5,081,069 619,009
2
Fast Adaptation to Incremental Knowledge Base. To efficiently adapt to evolving data
changes while ensuring accurate and relevant responses, LightRAG incrementally updates
the knowledge base without reprocessing the entire external database. The incremental
update algorithm processes new documents with the same graph-based indexing steps as
before, and then merges the new graph with the original one.
"""


# What the LightRAG paper says of itself, in Japanese, as a team's notes would put it.
JAPANESE_TEXT = """\
LightRAGは、香港大学のデータインテリジェンス研究室が開発した検索拡張生成の手法である。LightRAGは文書からエンティティと関係を抽出し、知識グラフを作る。

二段階検索では、低レベルのキーワードで具体的なエンティティを探し、高レベルのキーワードで広いテーマを探す。二段階検索はLightRAGの中心的な仕組みである。

GraphRAGはMicrosoftが発表した手法で、コミュニティ要約を作るために多くのトークンを使う。LightRAGの検索はGraphRAGより少ないトークンで済む。

黄超教授が香港大学の研究室を率いている。黄超教授は知識グラフと検索拡張生成を研究している。
"""

FRENCH_TEXT = """\
Marie Curie a découvert le polonium et le radium avec Pierre Curie à Paris. Marie Curie a reçu le prix Nobel \
de physique en 1903 et le prix Nobel de chimie en 1911.

L'Institut du radium, fondé à Paris en 1909, a permis à Marie Curie de poursuivre ses recherches sur la \
radioactivité. Ses carnets de laboratoire sont encore radioactifs aujourd'hui.
"""
