import importlib

from knowledge.models import DEFAULT_ENTITY_TYPES
from knowledge.rag import language
from knowledge.rag.chunking import chunk_text
from knowledge.rag.extraction.records import consolidate, parse_extraction
from knowledge.rag.extraction.rules import nlp_extract
from knowledge.rag.names import entity_key, normalize_name
from knowledge.rag.tokens import count_tokens

TYPES = ["person", "organization", "location"]


def test_names_are_normalized_but_their_display_form_is_kept():
    assert normalize_name('  "Marie   Curie" ') == "Marie Curie"
    assert normalize_name("**Acme Corp**") == "Acme Corp"
    assert entity_key("“ACME   corp”") == entity_key("Acme Corp") == "acme corp"


def test_the_parser_reads_entities_relations_and_keywords():
    parsed = parse_extraction(
        "\n".join(
            [
                "entity<|>Marie Curie<|>Person<|>A physicist.",
                '("entity"<|>"University of Paris"<|>"organization"<|>"Where she worked.")##',
                "1. relation<|>Marie Curie<|>University of Paris<|>research, workplace<|>She worked there.<|>7",
                "content_keywords<|>radioactivity, physics",
                "<|DONE|>",
            ]
        ),
        entity_types=TYPES,
    )

    assert parsed.entities == [
        {"name": "Marie Curie", "type": "person", "description": "A physicist."},
        {"name": "University of Paris", "type": "organization", "description": "Where she worked."},
    ]
    assert parsed.relations == [
        {
            "source": "Marie Curie",
            "target": "University of Paris",
            "keywords": "research, workplace",
            "description": "She worked there.",
            "strength": 7.0,
        }
    ]
    assert parsed.keywords == ["radioactivity", "physics"]
    assert parsed.skipped == 0


def test_bad_lines_are_skipped_and_counted():
    parsed = parse_extraction(
        "\n".join(
            [
                "Here are the entities:",
                "entity<|>missing fields",
                "entity<|> <|>person<|>No name.",
                "relation<|>A<|>A<|>self<|>Loops are dropped.<|>5",
                "relation<|>A<|>B",
                "entity<|>Good One<|>person<|>Fine.",
            ]
        ),
        entity_types=TYPES,
    )

    assert [entity["name"] for entity in parsed.entities] == ["Good One"]
    assert parsed.skipped == 5


def test_an_unknown_type_becomes_other_and_strengths_are_clamped():
    parsed = parse_extraction(
        "entity<|>Zed<|>spaceship<|>A ship.\n"
        "relation<|>Zed<|>Ann<|>crew<|>Ann flies Zed.<|>42\n"
        "relation<|>Zed<|>Bob<|>3<|>crew<|>Bob repairs Zed.",
        entity_types=TYPES,
    )

    assert parsed.entities[0]["type"] == "other"
    assert [relation["strength"] for relation in parsed.relations] == [10.0, 3.0]
    assert parsed.relations[1]["keywords"] == "crew"


def test_consolidation_gives_one_mention_per_key_and_per_unordered_pair():
    entities, relations = consolidate(
        {
            "entities": [
                {"name": "Acme Corp", "type": "organization", "description": "A company."},
                {"name": "ACME corp", "type": "organization", "description": "It makes anvils."},
            ],
            "relations": [
                {"source": "Acme Corp", "target": "Wile", "keywords": "supply", "description": "Sells.", "strength": 2},
                {
                    "source": "Wile",
                    "target": "acme corp",
                    "keywords": "Supply, trust",
                    "description": "Buys.",
                    "strength": 3,
                },
            ],
        }
    )

    assert entities["acme corp"].name == "Acme Corp"
    assert entities["acme corp"].description == "A company.\nIt makes anvils."
    assert entities["wile"].type == ""  # only named by a relation
    ((pair, relation),) = relations.items()
    assert pair == ("acme corp", "wile")
    assert (relation.strength, relation.keywords, relation.description) == (5.0, "supply, trust", "Sells.\nBuys.")


def test_the_nlp_extractor_finds_people_and_organisations_and_links_them_by_sentence():
    (records,) = nlp_extract(
        [
            "Ada Lovelace worked with Charles Babbage in London. "
            "Babbage later joined the Royal Society. The weather was cold."
        ],
        entity_types=["person", "organization", "location", "concept"],
    )

    types = {entity["name"]: entity["type"] for entity in records["entities"]}
    assert types["Ada Lovelace"] == "person"
    assert types["Charles Babbage"] == "person"
    assert types["London"] == "location"
    assert types["Royal Society"] == "organization"
    pair = next(
        relation
        for relation in records["relations"]
        if {relation["source"], relation["target"]} == {"Ada Lovelace", "Charles Babbage"}
    )
    assert pair["description"] == "Ada Lovelace worked with Charles Babbage in London."
    assert pair["strength"] == 1.0
    assert "work" in pair["keywords"]
    assert not any("weather" in (relation["source"] + relation["target"]) for relation in records["relations"])


def test_the_nlp_extractor_is_deterministic():
    text = ["Grace Hopper worked at Harvard University and later at Remington Rand."]

    assert nlp_extract(text, entity_types=TYPES) == nlp_extract(text, entity_types=TYPES)


# Real documentation that nobody here wrote and that ships with the interpreter: standard library
# module docstrings, a mix of prose, examples, command tables and regular-expression syntax.
STDLIB_DOCUMENTATION = [
    "argparse",
    "configparser",
    "cmd",
    "csv",
    "doctest",
    "heapq",
    "inspect",
    "json",
    "pdb",
    "pydoc",
    "re",
    "sched",
    "socketserver",
    "turtle",
    "unittest",
]
CODE_CHARACTERS = set("<>{}[]=\\|$^~#@`*_;")


def _extracted_from_stdlib_documentation():
    texts = [
        chunk.text for module in STDLIB_DOCUMENTATION for chunk in chunk_text(importlib.import_module(module).__doc__)
    ]
    tokens = sum(count_tokens(importlib.import_module(module).__doc__) for module in STDLIB_DOCUMENTATION)
    names, pairs = {}, set()
    for records in nlp_extract(texts, entity_types=DEFAULT_ENTITY_TYPES):
        names.update({entity_key(entity["name"]): entity["name"] for entity in records["entities"]})
        pairs.update(frozenset((relation["source"], relation["target"])) for relation in records["relations"])
    return tokens, set(names.values()), pairs


def test_on_real_documentation_the_nlp_graph_stays_under_fifteen_rows_per_thousand_tokens():
    tokens, names, pairs = _extracted_from_stdlib_documentation()

    assert tokens > 10_000
    # An LLM extractor keeps about 6 entities per 1,000 tokens; the spaCy one kept 53 to 71 before.
    assert 1000 * len(names) / tokens <= 15
    assert 1000 * len(pairs) / tokens <= 15
    # Sparse, not empty: the people and protocols the pages are about are there.
    assert {"Kent Beck", "Erich Gamma", "Seymour Papert", "TCP", "UDP"} <= names
    assert not [name for name in names if CODE_CHARACTERS & set(name) or "(" in name]


def test_markup_code_and_formula_fragments_never_become_entities():
    text = (
        "Marie Curie taught physics at the University of Paris. "
        "The loss is $\\mathcal{L} = \\sum_i \\log p(x_i)$ as in Vaswani et al. "
        "\\begin{equation} E = mc^2 \\end{equation} "
        '<script src="app.js"></script> <div class="note">Format</div> '
        "See systemd.unit(5) and git-commit(1) for details. "
        'Run `git commit --amend -m "fix"` or def main(): return argv[0] at https://example.org/x?y=1. '
        "Marie Curie later directed the Radium Institute in Paris, e.g. its laboratories. "
        "| Name | Value |\n|------|-------|\n| x | 1 |\n"
    )

    (records,) = nlp_extract([text], entity_types=DEFAULT_ENTITY_TYPES)

    # spaCy's own recognizer takes the formula for an amount of money and the table for a company.
    assert {"\\mathcal{L", "Value"} <= {entity.text for entity in language.ENGLISH.parse([text])[0].ents}
    names = {entity["name"] for entity in records["entities"]}
    assert {"Marie Curie", "University of Paris", "Radium Institute", "Paris"} <= names
    assert not [name for name in names if CODE_CHARACTERS & set(name) or "(" in name or "://" in name]
    assert not [name for name in names if name.casefold().startswith(("e.g", "format", "mathcal", "script"))]
