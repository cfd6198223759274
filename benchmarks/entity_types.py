"""Entity type precision of the rules extractor on real text: would a careful reader accept the type?

    .venv/bin/python benchmarks/entity_types.py              # precision on both halves of the sample
    .venv/bin/python benchmarks/entity_types.py --show       # and every entity typed wrong

The texts are real and not ours: seven pages of the Python 3.11 documentation as Debian installs
them (`apt-get install python3.11-doc`, read from /usr/share/doc) and the first 150 HotpotQA
passages of ../shared/datasets/multihop/hotpotqa.json, each passage one document with its title
as the first line, as benchmarks/multihop.py ingests them. Each text goes through the ingestion
path on the embedded defaults (parse_file, chunk_text, nlp_extract with DEFAULT_ENTITY_TYPES);
an entity's type in a text is the most common of its chunks' types, as the graph keeps it.

benchmarks/entity_types.json is the sample: 80 entities the extractor produced on those texts,
40 from each source, picked by a hash of their names (not by hand), three in four from the
named entities (typed other than "concept" by the extractor of 2026-11-25) and one in four from
the noun phrases. Each carries the sentences it came from and the types a careful reader would
accept, labelled by reading them, the first being the one they would give. An entity counts as
right when its type is one of them.

Items with an even index are the tuning half (the rules were tuned on them); odd ones are held
out. The script prints precision per half and per source, and the entities it no longer finds
(a change that drops entities is not a change of type).
"""

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DOCS = Path("/usr/share/doc/python3.11/html")
# The project sits beside ../shared, or a worktree of it one level further down; --data otherwise.
DATASETS = (
    next(
        (path for path in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if path.exists()),
        ROOT.parent / "shared",
    )
    / "datasets"
    / "multihop"
)
SAMPLE = Path(__file__).with_suffix(".json")
PAGES = [
    "howto/logging.html",
    "howto/functional.html",
    "howto/enum.html",
    "tutorial/classes.html",
    "tutorial/modules.html",
    "tutorial/stdlib.html",
    "tutorial/appetite.html",
]
PASSAGES = 150


def texts(docs: Path, datasets: Path) -> dict[str, tuple[str, str]]:
    """source -> (file name, document text) for every text of the sample."""
    from knowledge.rag.parsing import parse_file

    found = {}
    for page in PAGES:
        parsed = parse_file(Path(page).name, (docs / page).read_bytes())
        found[f"python:{page}"] = ("page", parsed.text)
    passages = json.loads((datasets / "hotpotqa.json").read_text())["passages"][:PASSAGES]
    for index, passage in enumerate(passages):
        found[f"hotpotqa:{index}"] = ("passage", f"{passage['title']}\n\n{passage['text']}")
    return found


def extracted(sources: dict[str, tuple[str, str]]) -> dict[str, dict[str, dict]]:
    """source -> entity key -> {"name", "type", "description"}, the type the graph would keep."""
    from knowledge.models import DEFAULT_ENTITY_TYPES
    from knowledge.rag.chunking import chunk_text
    from knowledge.rag.extraction.rules import nlp_extract
    from knowledge.rag.names import entity_key

    order, chunks = [], []
    for source, (_, text) in sources.items():
        for chunk in chunk_text(text):
            order.append(source)
            chunks.append(chunk.text)
    types: dict[str, dict[str, Counter]] = {}
    entities: dict[str, dict[str, dict]] = {source: {} for source in sources}
    for source, records in zip(order, nlp_extract(chunks, entity_types=DEFAULT_ENTITY_TYPES), strict=True):
        for entity in records["entities"]:
            key = entity_key(entity["name"])
            entities[source].setdefault(key, dict(entity))
            types.setdefault(source, {}).setdefault(key, Counter())[entity["type"]] += 1
    for source, counted in types.items():
        for key, counter in counted.items():
            entities[source][key]["type"] = counter.most_common(1)[0][0]
    return entities


def precision(items: list[dict], entities: dict[str, dict[str, dict]], show: bool) -> None:
    from knowledge.rag.names import entity_key

    halves = {"tuning": [], "held-out": []}
    for index, item in enumerate(items):
        halves["tuning" if index % 2 == 0 else "held-out"].append(item)
    print(f"{'half':10} {'source':9} {'right':>5} {'typed':>5} {'precision':>9} {'missing':>7}")
    for half, members in halves.items():
        for kind in ("python", "hotpotqa", "all"):
            right = typed = missing = 0
            for item in members:
                if kind != "all" and not item["source"].startswith(kind):
                    continue
                found = entities[item["source"]].get(entity_key(item["name"]))
                if found is None:
                    missing += 1
                    continue
                typed += 1
                if found["type"] in item["accept"]:
                    right += 1
                elif show and kind == "all":
                    print(f"  {half}: {item['name']!r} typed {found['type']}, a reader says {item['accept'][0]}")
            print(f"{half:10} {kind:9} {right:5} {typed:5} {right / max(typed, 1):9.2f} {missing:7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--show", action="store_true", help="print every entity typed wrong")
    parser.add_argument("--docs", type=Path, default=DOCS)
    parser.add_argument("--data", type=Path, default=DATASETS)
    arguments = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    items = json.loads(SAMPLE.read_text())["entities"]
    precision(items, extracted(texts(arguments.docs, arguments.data)), arguments.show)


if __name__ == "__main__":
    main()
