(() => {
  const container = document.getElementById("graph");
  const status = document.getElementById("graph-status");
  const search = document.getElementById("graph-search");
  const entityUrl = (id) => container.dataset.entityUrl.replace(/\/0\/$/, `/${id}/`);

  const palette = ["#2f6fdb", "#067647", "#b54708", "#7a5af8", "#c11574", "#0e9384", "#b42318", "#475467"];
  const colours = new Map();
  const colourOf = (type) => {
    if (!colours.has(type)) colours.set(type, palette[colours.size % palette.length]);
    return colours.get(type);
  };

  fetch(container.dataset.url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
    .then((response) => {
      if (!response.ok) throw new Error(`The graph could not be loaded (HTTP ${response.status}).`);
      return response.json();
    })
    .then((graph) => {
      if (!graph.nodes.length) {
        status.textContent = "No entities yet: the graph fills in as documents are ingested.";
        return;
      }
      const maxDegree = Math.max(1, ...graph.nodes.map((node) => node.degree));
      const elements = [
        ...graph.nodes.map((node) => ({
          data: { ...node, colour: colourOf(node.type), size: 12 + 38 * Math.sqrt(node.degree / maxDegree) },
        })),
        ...graph.edges.map((edge) => ({ data: edge })),
      ];
      // Force-directed layout reads best but grows quadratically; big graphs get a
      // concentric layout by degree, which stays instant at two thousand nodes.
      const layout =
        graph.nodes.length <= 400
          ? { name: "cose", animate: false, nodeRepulsion: 9000, idealEdgeLength: 80 }
          : { name: "concentric", concentric: (node) => node.data("degree"), levelWidth: () => 2, animate: false };
      const cy = cytoscape({
        container,
        elements,
        layout,
        wheelSensitivity: 0.3,
        style: [
          {
            selector: "node",
            style: {
              label: "data(label)",
              "background-color": "data(colour)",
              width: "data(size)",
              height: "data(size)",
              "font-size": 9,
              "text-valign": "bottom",
              "text-margin-y": 2,
              "min-zoomed-font-size": 7,
            },
          },
          { selector: "edge", style: { width: 1, "line-color": "#c5cad3", "curve-style": "haystack" } },
          { selector: ".dim", style: { opacity: 0.15 } },
          { selector: ".match", style: { "border-width": 3, "border-color": "#111827" } },
        ],
      });
      cy.on("tap", "node", (event) => {
        window.location.href = entityUrl(event.target.id());
      });
      status.textContent = `${graph.nodes.length} entities, ${graph.edges.length} relations.`;
      search.addEventListener("input", () => {
        const term = search.value.trim().toLowerCase();
        cy.elements().removeClass("dim match");
        if (!term) return;
        const matches = cy.nodes().filter((node) => node.data("label").toLowerCase().includes(term));
        cy.elements().addClass("dim");
        matches.closedNeighborhood().removeClass("dim");
        matches.addClass("match");
      });
    })
    .catch((error) => {
      status.textContent = error.message;
      status.classList.add("error");
    });
})();
