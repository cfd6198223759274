// Labels one can read at any zoom, on the graph page and in the chat's subgraph. A label that is
// shown is drawn at a fixed size on the screen (12 px), never shrunk with the zoom; a label is
// shown only where it overlaps no label already placed, the most important nodes placed first.
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
  function textWidth(text, zoom) {
    context.font = `${PX / zoom}px ${FONT}`;
    return context.measureText(text).width * zoom;
  }

  const shortened = (label) => (label.length > MAX_CHARS ? `${label.slice(0, MAX_CHARS - 1)}…` : label);

  // `rank(node)`: higher is placed first. `always`: a selector whose nodes are labelled even
  // where they overlap (a match, the selected node).
  function attach(cy, { rank, always = "" }) {
    let timer = 0;

    function place() {
      const zoom = cy.zoom();
      const [width, height] = [cy.width(), cy.height()];
      const grid = new Map();
      const collides = (box) => {
        for (let x = Math.floor(box.x1 / CELL); x <= Math.floor(box.x2 / CELL); x++) {
          for (let y = Math.floor(box.y1 / CELL); y <= Math.floor(box.y2 / CELL); y++) {
            for (const other of grid.get(`${x},${y}`) || []) {
              if (box.x1 < other.x2 && other.x1 < box.x2 && box.y1 < other.y2 && other.y1 < box.y2) return true;
            }
          }
        }
        return false;
      };
      const insert = (box) => {
        for (let x = Math.floor(box.x1 / CELL); x <= Math.floor(box.x2 / CELL); x++) {
          for (let y = Math.floor(box.y1 / CELL); y <= Math.floor(box.y2 / CELL); y++) {
            const key = `${x},${y}`;
            if (!grid.has(key)) grid.set(key, []);
            grid.get(key).push(box);
          }
        }
      };
      const nodes = cy.nodes(":visible").toArray();
      const forced = always ? new Set(cy.nodes(always).map((node) => node.id())) : new Set();
      nodes.sort((a, b) => Number(forced.has(b.id())) - Number(forced.has(a.id())) || rank(b) - rank(a));
      const labelled = new Map();
      for (const node of nodes) {
        const at = node.renderedPosition();
        const text = shortened(node.data("label") || "");
        // The text, its halo, a pixel of air, and the two model units cytoscape adds around a
        // label's box (so that the boxes it reports never overlap either).
        const air = 1 + 2 * zoom;
        const half = textWidth(text, zoom) / 2 + HALO + air;
        const top = at.y + node.renderedHeight() / 2;
        // A label that would cross the canvas's left or right edge is moved inside it.
        const shift = Math.max(0, -(at.x - half)) - Math.max(0, at.x + half - width);
        const box = {
          x1: at.x - half + shift, x2: at.x + half + shift, y1: top - air, y2: top + GAP + PX * 1.3 + HALO + air,
        };
        const must = forced.has(node.id());
        if (!must && (box.x1 < 0 || box.x2 > width || box.y1 < 0 || box.y2 > height)) continue;
        if (!must && collides(box)) continue;
        insert(box);
        labelled.set(node.id(), shift);
      }
      cy.batch(() => {
        cy.nodes().forEach((node) => {
          const shown = labelled.has(node.id());
          node.toggleClass("labelled", shown);
          if (shown) {
            node.data({
              labelText: shortened(node.data("label") || ""),
              labelSize: PX / zoom,
              labelHalo: HALO / zoom,
              labelGap: GAP / zoom,
              labelShift: labelled.get(node.id()) / zoom,
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
        "text-margin-y": "data(labelGap)",
        "text-margin-x": "data(labelShift)",
        "text-outline-color": "#ffffff",
        "text-valign": "bottom",
        color: "#1d2330",
        "min-zoomed-font-size": 0,
        // Drawn above the unlabelled nodes, so none of them hides a label's text.
        "z-index": 5,
      },
    },
  ];

  window.GraphLabels = { attach, style, PX };
})();
