"""trafilatura against readability-lxml on real documentation pages: boilerplate dropped, structure kept.

    .venv/bin/python benchmarks/html_extractors.py          # Python (Sphinx) and PostgreSQL (DocBook) manuals

The pages are the Debian packages' HTML manuals (`apt-get install python3.11-doc postgresql-doc-15`):
every page has navigation, and the Sphinx ones a sidebar with "Previous topic / Next topic", a
search box and a footer. For each page, the main content is the element the generator puts it
in (Sphinx: role="main"; DocBook: the page's body without its navheader and navfooter). Per
extractor and manual this prints:

- boilerplate: pages where a navigation, sidebar or footer string reached the output;
- headings, code blocks, tables, list items: how many of those in the main content the output
  keeps as structure (a heading as a heading, a code block with its lines, ...);
- recall: the share of the main content's words found in the output.

readability-lxml is a dev dependency for this comparison only (`pip install -e '.[dev]'`).
"""

import re
import statistics
import sys
import time
from pathlib import Path

import lxml.etree
import lxml.html

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MANUALS = {
    "python (Sphinx)": (
        Path("/usr/share/doc/python3.11/html"),
        ["tutorial/*.html", "howto/*.html"],
        "//div[@role='main']",
        [r"Previous topic", r"Next topic", r"This Page", r"Quick search", r"Show Source", r"Report a Bug",
         r"modules \|", r"\bNavigation\b", r"Copyright", r"Table of Contents"],
    ),
    "postgresql (DocBook)": (
        Path("/usr/share/doc/postgresql-doc-15/html"),
        ["tutorial-*.html", "ddl-*.html", "indexes-*.html", "textsearch-*.html"],
        "//body",
        # The navigation bars' link texts: "Prev", "Up", "Home", "Next" (capitalized, alone).
        [r"\bPrev\b", r"\bHome\b", r"\bUp\b"],
    ),
}  # fmt: skip
WORD = re.compile(r"\w+")
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>", re.IGNORECASE)
STRUCTURE = {
    "headings": ("h1", "h2", "h3", "h4", "h5", "h6"),
    "code": ("pre",),
    "tables": ("table",),
    "items": ("li",),
}
# What each extractor's output calls the same structures.
TRAFILATURA_TAGS = {"headings": ("head",), "code": ("code",), "tables": ("table",), "items": ("item",)}


def main_element(html: str, xpath: str):
    root = lxml.html.fromstring(html)
    found = root.xpath(xpath)
    main = found[0] if found else root
    for navigation in main.xpath(".//*[contains(@class,'navheader') or contains(@class,'navfooter')]"):
        navigation.drop_tree()
    return main


def counts(element, names: dict) -> dict:
    # trafilatura marks inline code and code blocks alike; a block is one with a line break.
    return {
        kind: sum(
            1 for tag in tags for found in element.iter(tag) if tag != "code" or "\n" in "".join(found.itertext())
        )
        for kind, tags in names.items()
    }


def trafilatura_output(html: str):
    import trafilatura

    from knowledge.rag.parsing.html import _trafilatura_config

    xml = trafilatura.extract(
        html,
        output_format="xml",
        include_formatting=True,
        include_tables=True,
        include_links=False,
        favor_recall=True,
        config=_trafilatura_config(),
    )
    if not xml:
        return None, ""
    main = lxml.etree.fromstring(xml.encode()).find("main")
    return main, " ".join(main.itertext())


def readability_output(html: str):
    from readability import Document

    summary = lxml.html.fromstring(Document(html).summary(html_partial=True))
    return summary, summary.text_content()


def measure(name: str, folder: Path, patterns: list[str], xpath: str, markers: list[str]) -> None:
    pages = sorted(page for pattern in patterns for page in folder.glob(pattern))
    if not pages:
        print(f"{name}: no pages in {folder} (apt-get install the manual)")
        return
    results = {"trafilatura": [], "readability-lxml": []}
    for page in pages:
        # lxml refuses a str with an encoding declaration; the product strips it the same way.
        html = _XML_DECLARATION.sub("", page.read_text(encoding="utf-8", errors="replace"), count=1)
        main = main_element(html, xpath)
        expected = counts(main, STRUCTURE)
        words = set(WORD.findall(main.text_content().lower()))
        for extractor, run in (("trafilatura", trafilatura_output), ("readability-lxml", readability_output)):
            started = time.perf_counter()
            output, text = run(html)
            elapsed = time.perf_counter() - started
            if output is None:
                results[extractor].append({"leaked": False, "recall": 0.0, "ms": elapsed * 1000, "kept": {}})
                continue
            found = counts(output, TRAFILATURA_TAGS if extractor == "trafilatura" else STRUCTURE)
            results[extractor].append(
                {
                    "leaked": any(re.search(marker, text) for marker in markers),
                    "recall": len(words & set(WORD.findall(text.lower()))) / max(len(words), 1),
                    "ms": elapsed * 1000,
                    "kept": {kind: (min(found[kind], expected[kind]), expected[kind]) for kind in STRUCTURE},
                }
            )
    print(f"\n{name}: {len(pages)} pages from {folder}")
    print(f"{'extractor':18} {'boilerplate':>12} {'headings':>10} {'code':>10} {'tables':>8} {'items':>11} "
          f"{'recall':>7} {'ms/page':>8}")  # fmt: skip
    for extractor, rows in results.items():
        kept = {
            kind: (
                sum(row["kept"].get(kind, (0, 0))[0] for row in rows),
                sum(row["kept"].get(kind, (0, 0))[1] for row in rows),
            )
            for kind in STRUCTURE
        }
        cells = " ".join(
            f"{f'{kept[kind][0]}/{kept[kind][1]}':>{width}}"
            for kind, width in (("headings", 10), ("code", 10), ("tables", 8), ("items", 11))
        )
        leaked = sum(row["leaked"] for row in rows)
        print(
            f"{extractor:18} {f'{leaked}/{len(rows)} pages':>12} {cells} "
            f"{statistics.mean(row['recall'] for row in rows):7.3f} {statistics.median(row['ms'] for row in rows):8.1f}"
        )


def main() -> None:
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    for name, (folder, patterns, xpath, markers) in MANUALS.items():
        measure(name, folder, patterns, xpath, markers)


if __name__ == "__main__":
    main()
