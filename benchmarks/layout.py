"""How well the chat's subgraph layout separates clusters and keeps labels apart.

    .venv/bin/python benchmarks/layout.py [--clusters 5 --per-cluster 6 --runs 10]

Draws clustered graphs like a retrieved subgraph (hubs with their neighbours, a few links inside
each cluster, some hub-to-hub bridges; labels like entity names) in Debian's chromium with the
vendored Cytoscape and fcose, lays each out with cose, plain fcose and the chat's fcose options
(static/js/chat.js, `layout`), and prints medians over the runs of: separation (mean distance
between nodes of different clusters over mean distance within a cluster; higher separates more)
and the number of overlapping label boxes.
"""

import argparse
import statistics
from pathlib import Path

from playwright.sync_api import sync_playwright

VENDOR = Path(__file__).resolve().parent.parent / "static" / "vendor"
SCRIPTS = ["cytoscape.min.js", "layout-base.js", "cose-base.js", "cytoscape-fcose.js"]

MEASURE = """
([layout, clusters, per, seed]) => {
  let state = seed;
  const random = () => (state = (state * 16807) % 2147483647) / 2147483647;
  const elements = [];
  const clusterOf = {};
  for (let c = 0; c < clusters; c++) {
    for (let i = 0; i < per; i++) {
      const id = `n${c}_${i}`;
      clusterOf[id] = c;
      elements.push({ data: { id, label: `Entity number ${c * per + i}` } });
      if (i) elements.push({ data: { id: `e${c}_${i}`, source: `n${c}_0`, target: id } });
      if (i > 2 && random() < 0.3) {
        elements.push({ data: { id: `x${c}_${i}`, source: id, target: `n${c}_${Math.floor(random() * i)}` } });
      }
    }
  }
  for (let c = 1; c < clusters; c++) {
    if (random() < 0.5) elements.push({ data: { id: `b${c}`, source: `n${c}_0`, target: `n${c - 1}_0` } });
  }
  const cy = cytoscape({
    container: document.getElementById("graph"), elements,
    style: [{ selector: "node", style: { label: "data(label)", "font-size": 12, width: 20, height: 20,
      "text-valign": "bottom", "text-max-width": 130, "text-wrap": "ellipsis" } }],
  });
  const bridge = (edge) => edge.source().degree() > 3 && edge.target().degree() > 3;
  const fcose = { name: "fcose", quality: "proof", randomize: true, animate: false,
    nodeDimensionsIncludeLabels: true, nodeSeparation: 90, packComponents: true, tile: true };
  const options = {
    cose: { name: "cose", animate: false, randomize: true, nodeRepulsion: 9000 },
    fcose: { ...fcose, idealEdgeLength: 70, nodeRepulsion: 9000 },
    chat: { ...fcose, idealEdgeLength: (e) => (bridge(e) ? 250 : 40), edgeElasticity: (e) => (bridge(e) ? 0.05 : 0.6),
      nodeRepulsion: 4500, gravity: 0.1 },
  }[layout];
  cy.layout(options).run();
  const nodes = cy.nodes();
  const boxes = nodes.map((node) => node.boundingBox({ includeLabels: true }));
  const inside = [], across = [];
  let overlaps = 0;
  for (let i = 0; i < nodes.length; i++) {
    for (let j = i + 1; j < nodes.length; j++) {
      const a = nodes[i].position(), b = nodes[j].position();
      (clusterOf[nodes[i].id()] === clusterOf[nodes[j].id()] ? inside : across).push(Math.hypot(a.x - b.x, a.y - b.y));
      const p = boxes[i], q = boxes[j];
      if (p.x1 < q.x2 && q.x1 < p.x2 && p.y1 < q.y2 && q.y1 < p.y2) overlaps += 1;
    }
  }
  const mean = (values) => values.reduce((x, y) => x + y, 0) / values.length;
  return { separation: mean(across) / mean(inside), overlaps };
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=5)
    parser.add_argument("--per-cluster", type=int, default=6)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        page.set_content('<div id="graph" style="width:600px;height:320px"></div>')
        for script in SCRIPTS:
            page.add_script_tag(path=str(VENDOR / script))
        print(f"{args.clusters} clusters of {args.per_cluster}, {args.runs} runs (medians)")
        for layout in ("cose", "fcose", "chat"):
            runs = [
                page.evaluate(MEASURE, [layout, args.clusters, args.per_cluster, seed])
                for seed in range(1, args.runs + 1)
            ]
            separation = statistics.median(run["separation"] for run in runs)
            overlaps = statistics.median(run["overlaps"] for run in runs)
            print(f"{layout:6} separation {separation:5.2f}   overlapping labels {overlaps:5.1f}")
        browser.close()


if __name__ == "__main__":
    main()
