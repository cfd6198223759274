// The workspace graph: the best-connected entities, filters by type and degree, find-and-centre,
// and a side panel with the selected entity (server-rendered, fetched by htmx) so the reader
// never leaves the page.
(() => {
  "use strict";

  const container = document.getElementById("graph");
  const status = document.getElementById("graph-status");
  const search = document.getElementById("graph-search");
  const panel = document.getElementById("entity-panel");
  const minDegree = document.getElementById("graph-min-degree");
  const minDegreeValue = document.getElementById("graph-min-degree-value");
  const entityUrl = (id) => container.dataset.entityUrl.replace(/\/0\/$/, `/${Number(id)}/`);
  // Above this many nodes the canvas drops what costs most while moving (edges, pixel ratio).
  const LARGE = 400;

  const hiddenTypes = new Set();
  let cy = null;
  let labels = null;
  let summary = "";
  const stats = {};
  window.graphView = { cy: () => cy, stats };

  fetch(container.dataset.url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
    .then((response) => {
      if (!response.ok) throw new Error(`The graph could not be loaded (HTTP ${response.status}).`);
      return response.json();
    })
    .then(draw)
    .catch((error) => {
      status.textContent = error.message;
      status.classList.add("error");
    });

  function draw(graph) {
    if (!graph.nodes.length) {
      status.textContent = "No entities yet: the graph fills in as documents are ingested.";
      return;
    }
    const large = graph.nodes.length > LARGE;
    const maxDegree = Math.max(1, ...graph.nodes.map((node) => node.degree));
    const elements = [
      ...graph.nodes.map((node) => {
        const type = EntityPalette.normalize(node.type) || "untyped";
        return {
          data: {
            ...node, type, colour: EntityPalette.colourOf(type),
            size: 12 + 38 * Math.sqrt(node.degree / maxDegree),
          },
        };
      }),
      ...graph.edges.map((edge) => ({ data: edge })),
    ];
    cy = cytoscape({
      container,
      elements,
      wheelSensitivity: 0.3,
      minZoom: 0.05,
      maxZoom: 4,
      hideEdgesOnViewport: large,
      textureOnViewport: large,
      pixelRatio: large ? 1 : "auto",
      style: [
        {
          selector: "node",
          style: {
            "background-color": "data(colour)",
            width: "data(size)",
            height: "data(size)",
            "border-width": large ? 0 : 1,
            "border-color": "#ffffff",
          },
        },
        ...GraphLabels.style,
        { selector: "edge", style: { width: 1, "line-color": "#c5cad3", "curve-style": "haystack", opacity: large ? 1 : 0.8 } },
        { selector: ".filtered", style: { display: "none" } },
        { selector: ".dim", style: { opacity: 0.12 } },
        { selector: "node.match", style: { "border-width": 4, "border-color": "#111827", "z-index": 10 } },
        { selector: "node.selected-entity", style: { "border-width": 5, "border-color": "#111827", "z-index": 20 } },
      ],
    });
    labels = GraphLabels.attach(cy, { rank: (node) => node.data("degree"), always: "node.match, node.selected-entity" });
    runLayout(graph.nodes.length);
    summary = `${graph.nodes.length} entities, ${graph.edges.length} relations.`;
    status.textContent = summary;
    minDegree.max = String(maxDegree);
    renderLegend();
    cy.on("tap", "node", (event) => select(event.target));
    cy.on("tap", (event) => {
      if (event.target === cy) clearHighlight();
    });
  }

  // fcose separates the clusters; its spectral "draft" pass alone is linear enough for
  // two thousand nodes, and the full pass is kept for graphs one can read node by node.
  function runLayout(count, elements = null) {
    const options = count > LARGE
      ? { name: "fcose", quality: "draft", randomize: true, animate: false, packComponents: true, samplingType: true, sampleSize: 25 }
      : { name: "fcose", quality: "default", randomize: true, animate: false, nodeRepulsion: 9000, idealEdgeLength: 80, packComponents: true };
    const started = performance.now();
    const layout = (elements || cy.elements()).layout(options);
    layout.one("layoutstop", () => {
      Object.assign(stats, { layout: `fcose/${options.quality}`, layoutMs: Math.round(performance.now() - started), nodes: count });
      fitView();
    });
    layout.run();
  }

  // A small graph fitted to the canvas would be drawn at four times its size.
  function fitView() {
    cy.fit(cy.elements(":visible"), 30);
    if (cy.zoom() > 1.5) {
      cy.zoom(1.5);
      cy.center();
    }
  }

  // ---- Filters: types (legend buttons) and minimum degree ----------------------------------

  function renderLegend() {
    const counts = new Map();
    cy.nodes().forEach((node) => counts.set(node.data("type"), (counts.get(node.data("type")) || 0) + 1));
    EntityPalette.renderLegend(document.getElementById("graph-legend"), counts, {
      hidden: hiddenTypes,
      onToggle: (type, shown) => {
        if (shown) hiddenTypes.delete(type);
        else hiddenTypes.add(type);
        applyFilters();
      },
    });
  }

  function applyFilters() {
    const least = Number(minDegree.value);
    minDegreeValue.textContent = String(least);
    cy.batch(() => {
      cy.nodes().forEach((node) => {
        const hide = hiddenTypes.has(node.data("type")) || node.data("degree") < least;
        node.toggleClass("filtered", hide);
      });
    });
    const shown = cy.nodes().not(".filtered").length;
    status.textContent = shown === cy.nodes().length ? summary : `${shown} of ${summary}`;
    // What is left is laid out again, with the full pass once it is small enough to read.
    clearTimeout(relayout);
    relayout = setTimeout(() => runLayout(shown, cy.elements(":visible")), 300);
  }
  let relayout = 0;
  minDegree.addEventListener("input", () => cy && applyFilters());

  // ---- Find: Enter highlights the matches, centres the best one and opens it in the panel ----

  // The exact name first, then names that start with the term, then a word of the name that
  // does, then the rest; the best-connected first among equals.
  function closeness(label, term) {
    const name = label.toLowerCase();
    if (name === term) return 3;
    if (name.startsWith(term)) return 2;
    return name.split(/[\s\-_/.,()]+/).some((word) => word.startsWith(term)) ? 1 : 0;
  }

  document.getElementById("graph-search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!cy) return;
    const term = search.value.trim().toLowerCase();
    clearHighlight();
    if (!term) return;
    const matches = cy.nodes().not(".filtered").filter((node) => node.data("label").toLowerCase().includes(term));
    if (!matches.length) {
      status.textContent = `Nothing shown matches “${search.value.trim()}”.`;
      return;
    }
    const ranked = matches.toArray().sort((a, b) =>
      closeness(b.data("label"), term) - closeness(a.data("label"), term) || b.data("degree") - a.data("degree"));
    const best = ranked[0];
    cy.elements().addClass("dim");
    matches.closedNeighborhood().removeClass("dim");
    matches.addClass("match");
    select(best, { centre: false });
    // Centred, with its neighbours in view, at no more than a comfortable zoom: labels stay 12 px
    // on screen and only where they fit, so zooming further in would show nothing more.
    const at = best.position();
    const box = best.closedNeighborhood().nodes().boundingBox();
    const reach = (low, high, centre) => Math.max(centre - low, high - centre, 1);
    const zoom = Math.max(cy.minZoom(), Math.min(1.5,
      (cy.width() / 2 - 60) / reach(box.x1, box.x2, at.x), (cy.height() / 2 - 60) / reach(box.y1, box.y2, at.y)));
    cy.animate({ zoom, pan: { x: cy.width() / 2 - at.x * zoom, y: cy.height() / 2 - at.y * zoom }, duration: 300 });
    const others = matches.length - 1;
    status.textContent = `${matches.length} match${matches.length === 1 ? "" : "es"} for “${search.value.trim()}”`
      + (others ? `: showing ${best.data("label")}.` : ".");
  });
  search.addEventListener("input", () => {
    if (!search.value.trim() && cy) clearHighlight();
  });

  function clearHighlight() {
    cy.elements().removeClass("dim match");
    labels.later();
  }

  // ---- The side panel -------------------------------------------------------------------------

  function select(node, { centre = true } = {}) {
    cy.nodes().removeClass("selected-entity");
    node.addClass("selected-entity");
    labels.later();
    if (centre) cy.animate({ center: { eles: node }, duration: 250 });
    htmx.ajax("GET", entityUrl(node.id()), { target: "#entity-panel", swap: "innerHTML" });
  }

  // Entities named in the panel open in the panel (and are centred when drawn).
  panel.addEventListener("click", (event) => {
    const link = event.target.closest("a[data-entity]");
    if (!link || event.ctrlKey || event.metaKey || event.shiftKey) return;
    event.preventDefault();
    const node = cy && cy.getElementById(link.dataset.entity);
    if (node && node.length) select(node);
    else htmx.ajax("GET", entityUrl(link.dataset.entity), { target: "#entity-panel", swap: "innerHTML" });
  });
  panel.addEventListener("htmx:afterSwap", () => panel.scrollTo(0, 0));
})();
