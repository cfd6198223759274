// Labels one can read at any zoom, on the graph page and in the chat's subgraph. A label that is
// shown is drawn at a fixed size on the screen (12 px), never shrunk with the zoom; a label is
// shown only where it overlaps no label already placed (below, above, beside or at a corner of
// its node), the most important nodes placed first.
// Zooming in makes room, so more labels appear; zooming out never gives unreadable ones.
(function () {
  "use strict";

  const PX = 12;
  const HALO = 2;
  const GAP = 2;
  const MAX_CHARS = 32;
  const FONT = '"Helvetica Neue", Helvetica, sans-serif'; // cytoscape's default label font
  const CELL = 64;
  const context = document.createElement("canvas").getContext("2d");

  // Measured at the size cytoscape draws it (12 px over the zoom, then scaled): text does not
  // scale linearly with its size, so a width measured at 12 px can be short by a pixel or two.
  function textWidth(text, zoom, weight) {
    context.font = `${weight} ${PX / zoom}px ${FONT}`;
    return context.measureText(text).width * zoom;
  }

  const shortened = (label) => (label.length > MAX_CHARS ? `${label.slice(0, MAX_CHARS - 1)}…` : label);

  // Where a label may go, in order of preference: below its node, above it, beside it, then
  // at its corners.
  const SIDES = [
    ["bottom", "center"], ["top", "center"], ["center", "right"], ["center", "left"],
    ["bottom", "right"], ["bottom", "left"], ["top", "right"], ["top", "left"],
  ];
  // Important labels (what an answer cites) are placed together, trying each one's sides until
  // all fit, so that two of them close to each other do not push one out; the budget bounds a
  // search that could otherwise try 8^n arrangements.
  const TOGETHER = 6;
  const BUDGET = 4000;

  const overlaps = (a, b) => a.x1 < b.x2 && b.x1 < a.x2 && a.y1 < b.y2 && b.y1 < a.y2;

  // `rank(node)`: higher is placed first. `always`: a selector whose nodes are labelled even
  // where they overlap (a match, the selected node). `together`: a selector whose first few
  // nodes are placed jointly before the rest.
  function attach(cy, { rank, always = "", together = "" }) {
    let timer = 0;

    // The label's possible boxes on the screen: the text, its halo, a pixel of air, and the two
    // model units cytoscape adds around a label's box (so that the boxes it reports never
    // overlap either). A centred label that would cross the canvas's left or right edge is
    // moved inside it rather than cut.
    function spots(node, zoom, width) {
      const at = node.renderedPosition();
      const [w, h] = [node.renderedWidth() / 2, node.renderedHeight() / 2];
      const air = 1 + 2 * zoom;
      const wide = textWidth(shortened(node.data("label") || ""), zoom, node.style("font-weight"));
      const tall = PX * 1.3;
      const pad = HALO + air;
      const shift = Math.max(0, wide / 2 + pad - at.x) - Math.max(0, at.x + wide / 2 + pad - width);
      return SIDES.map(([valign, halign]) => {
        const dx = halign === "right" ? GAP : halign === "left" ? -GAP : shift;
        const dy = valign === "bottom" ? GAP : valign === "top" ? -GAP : 0;
        const x1 = halign === "right" ? at.x + w + GAP : halign === "left" ? at.x - w - GAP - wide : at.x - wide / 2 + shift;
        const y1 = valign === "bottom" ? at.y + h + GAP : valign === "top" ? at.y - h - GAP - tall : at.y - tall / 2;
        const box = { x1: x1 - pad, x2: x1 + wide + pad, y1: y1 - pad, y2: y1 + tall + pad };
        return { valign, halign, dx, dy, box };
      });
    }

    function place() {
      const zoom = cy.zoom();
      const [width, height] = [cy.width(), cy.height()];
      const grid = new Map();
      const cells = (box, visit) => {
        for (let x = Math.floor(box.x1 / CELL); x <= Math.floor(box.x2 / CELL); x++) {
          for (let y = Math.floor(box.y1 / CELL); y <= Math.floor(box.y2 / CELL); y++) visit(`${x},${y}`);
        }
      };
      const collides = (box) => {
        let hit = false;
        cells(box, (key) => {
          hit = hit || (grid.get(key) || []).some((other) => overlaps(box, other));
        });
        return hit;
      };
      const insert = (box) => cells(box, (key) => {
        if (!grid.has(key)) grid.set(key, []);
        grid.get(key).push(box);
      });
      const inside = (box) => box.x1 >= 0 && box.x2 <= width && box.y1 >= 0 && box.y2 <= height;
      const free = (spot) => inside(spot.box) && !collides(spot.box);

      const nodes = cy.nodes(":visible").toArray();
      const forced = always ? new Set(cy.nodes(always).map((node) => node.id())) : new Set();
      nodes.sort((a, b) => Number(forced.has(b.id())) - Number(forced.has(a.id())) || rank(b) - rank(a));
      const labelled = new Map();
      const keep = (node, spot) => {
        insert(spot.box);
        labelled.set(node.id(), spot);
      };
      for (const node of nodes.filter((node) => forced.has(node.id()))) {
        const options = spots(node, zoom, width);
        keep(node, options.find(free) || options[0]);
      }

      const first = together ? nodes.filter((node) => !forced.has(node.id()) && node.is(together)).slice(0, TOGETHER) : [];
      const options = first.map((node) => spots(node, zoom, width).filter(free));
      const chosen = [];
      let steps = 0;
      const search = (index) => {
        if (index === first.length) return true;
        for (const spot of options[index]) {
          if (++steps > BUDGET) return false;
          if (chosen.some((other) => overlaps(spot.box, other.box))) continue;
          chosen.push(spot);
          if (search(index + 1)) return true;
          chosen.pop();
        }
        return false;
      };
      if (first.length && search(0)) first.forEach((node, index) => keep(node, chosen[index]));

      for (const node of nodes) {
        if (labelled.has(node.id())) continue;
        const spot = spots(node, zoom, width).find(free);
        if (spot) keep(node, spot);
      }
      cy.batch(() => {
        cy.nodes().forEach((node) => {
          const shown = labelled.has(node.id());
          node.toggleClass("labelled", shown);
          if (shown) {
            const spot = labelled.get(node.id());
            node.data({
              labelText: shortened(node.data("label") || ""),
              labelSize: PX / zoom,
              labelHalo: HALO / zoom,
              labelValign: spot.valign,
              labelHalign: spot.halign,
              labelDx: spot.dx / zoom,
              labelDy: spot.dy / zoom,
            });
          }
        });
      });
    }

    const later = () => {
      clearTimeout(timer);
      timer = setTimeout(place, 60);
    };
    cy.on("viewport resize", later);
    cy.on("layoutstop", later);
    return { place, later };
  }

  // The style rules that go with attach(): no label unless placed, and placed ones at 12 px.
  const style = [
    { selector: "node", style: { label: "" } },
    {
      selector: "node.labelled",
      style: {
        label: "data(labelText)",
        "font-size": "data(labelSize)",
        "text-outline-width": "data(labelHalo)",
        "text-margin-x": "data(labelDx)",
        "text-margin-y": "data(labelDy)",
        "text-outline-color": "#ffffff",
        "text-valign": "data(labelValign)",
        "text-halign": "data(labelHalign)",
        color: "#1d2330",
        "min-zoomed-font-size": 0,
        // Drawn above the unlabelled nodes, so none of them hides a label's text.
        "z-index": 5,
      },
    },
  ];

  window.GraphLabels = { attach, style, PX };
})();
