"""The graph as the browser draws it (Cytoscape elements), written once for every view: the
workspace graph page, the subgraph next to an answer, and the neighbours a reader expands.

A node's `degree` sizes it; `row` is the context row that holds it (E3, R7) when an answer was
built from it, so the page can link the two; `description` fills its hover card.
"""


def graph_node(*, pk: int, name: str, type: str, degree: int, row: str | None = None, description: str = "") -> dict:
    return {"id": str(pk), "label": name, "type": type, "degree": degree, "row": row, "description": description}


def graph_edge(
    *,
    pk: int,
    source_id: int,
    target_id: int,
    weight: float,
    keywords: str,
    row: str | None = None,
    description: str = "",
) -> dict:
    return {
        "id": f"r{pk}",
        "source": str(source_id),
        "target": str(target_id),
        "weight": weight,
        "keywords": keywords,
        "row": row,
        "description": description,
    }
