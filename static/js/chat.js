// The chat page's JavaScript: what htmx cannot do. htmx's websocket extension owns the socket
// (ws-connect, and ws-send on the question form) and swaps in the server's partials: the question
// with its open answer (chat/_turn.html), the finished answer (chat/_message.html) and its sources
// (chat/_sources.html). This file streams tokens into the open answer as plain text (the server
// renders the Markdown once, when the answer ends), draws the subgraph with Cytoscape, and links
// the graph, the answer's markers and the sources panel.
(function () {
  "use strict";

  const config = JSON.parse(document.getElementById("chat-config").textContent);
  const $ = (id) => document.getElementById(id);
  const messages = $("messages");
  const form = $("ask-form");
  const questionBox = $("ask-question");
  const sendButton = $("ask-send");
  const stopButton = $("ask-stop");

  // ---- The socket ------------------------------------------------------------------------

  let socket = null;
  let streaming = null;

  document.body.addEventListener("htmx:wsOpen", (event) => {
    socket = event.detail.socketWrapper;
    setStatus("Ready.");
    setBusy(false);
  });

  document.body.addEventListener("htmx:wsClose", (event) => {
    socket = null;
    sendButton.disabled = true;
    if (streaming) failStream("The connection dropped before the answer was complete.");
    const code = event.detail.event.code;
    if (code === 4401) return setStatus("Your session has ended: reload the page and log in again.", true);
    if (code === 4403) return setStatus("You are not a member of this workspace.", true);
    setStatus("Connection lost; reconnecting…", true);
  });

  // Events (JSON) are this file's; partials (HTML) are htmx's to swap.
  document.body.addEventListener("htmx:wsBeforeMessage", (event) => {
    if (!event.detail.message.startsWith("{")) return;
    event.preventDefault();
    const data = JSON.parse(event.detail.message);
    ({ retrieval: onRetrieval, token: onToken, done: onDone, error: onError })[data.type]?.(data);
  });

  document.body.addEventListener("htmx:wsAfterMessage", () => {
    // A new conversation gets its own address.
    const url = $("ask-conversation").dataset.url;
    if (url && location.pathname !== url) history.replaceState(null, "", url);
    showSwappedSources();
    follow();
  });

  // ---- Scope: the documents a question may read (templates/chat/_scope_picker.html) ----------

  function scopeFilters() {
    const picked = (name) => [...document.querySelectorAll(`#ask-scope [name="${name}"]:checked`)].map((box) => box.value);
    return { tags: picked("scope_tag"), documents: picked("scope_document").map(Number) };
  }

  $("ask-scope")?.addEventListener("change", () => {
    const { tags, documents } = scopeFilters();
    const plural = (count, word) => `${count} ${word}${count === 1 ? "" : "s"}`;
    $("scope-summary").textContent = tags.length || documents.length
      ? `${plural(tags.length, "tag")}, ${plural(documents.length, "document")}`
      : "all documents";
  });

  // ---- Asking and streaming --------------------------------------------------------------

  document.body.addEventListener("htmx:wsConfigSend", (event) => {
    if (event.target !== form) return;
    const question = questionBox.value.trim();
    if (streaming || !question) {
      event.preventDefault();
      if (!streaming) setStatus("Type a question first.", true);
      return;
    }
    if (event.detail.errors.length) return;
    streaming = { question, text: "", frame: 0 };
  });

  document.body.addEventListener("htmx:validation:halted", (event) => {
    const [error] = event.detail.errors || [];
    if (error) setStatus(`${error.elt.labels?.[0]?.textContent.trim() || "Question"}: ${error.message}`, true);
  });

  form.addEventListener("htmx:wsAfterSend", () => {
    questionBox.value = "";
    following = true;
    setBusy(true);
    setStatus("Searching the knowledge graph…");
  });

  questionBox.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  stopButton.addEventListener("click", stop);

  function stop() {
    if (streaming && socket) {
      socket.send(JSON.stringify({ type: "cancel" }));
      setStatus("Stopping…");
    }
  }

  const liveAnswer = () => $("answer-live");

  function onRetrieval(event) {
    if (!streaming) return;
    const total = event.timings && event.timings.total;
    setStatus(total ? `Sources found in ${Math.round(total)} ms; answering…` : "Answering…");
    liveAnswer()?.querySelector(".answer-body").classList.add("streaming");
  }

  function onToken(event) {
    if (!streaming) return;
    streaming.text += event.text;
    // One update per frame however fast tokens arrive.
    if (!streaming.frame) {
      streaming.frame = requestAnimationFrame(() => {
        if (!streaming) return;
        streaming.frame = 0;
        const body = liveAnswer()?.querySelector(".answer-body");
        if (body) body.textContent = streaming.text;
        follow();
      });
    }
  }

  function onDone(event) {
    if (!streaming) return;
    cancelAnimationFrame(streaming.frame);
    // Without a saved answer nothing replaced the open one: say why it stays empty.
    const live = liveAnswer();
    if (live) {
      live.querySelector(".answer-body").classList.remove("streaming");
      if (event.stopped && !event.message) {
        live.querySelector(".answer-body").replaceChildren(note("Stopped before the answer began; nothing was saved."));
      }
      live.removeAttribute("id");
    }
    const usage = event.usage || {};
    const tokens = (usage.prompt_tokens || 0) + (usage.completion_tokens || 0);
    setStatus(event.stopped ? "Stopped." : tokens ? `Done · ${tokens} tokens.` : "Done.");
    endStream();
    follow();
  }

  function onError(event) {
    if (streaming) return failStream(event.message);
    setStatus(event.message, true);
  }

  function failStream(message) {
    const { question } = streaming;
    cancelAnimationFrame(streaming.frame);
    const live = liveAnswer();
    if (live) {
      live.querySelector(".answer-body").classList.remove("streaming");
      live.classList.add("message-error");
      live.querySelector(".answer-body").append(note(message, "error"));
      live.removeAttribute("id");
    }
    // The question is not lost: it goes back into the box for another try.
    if (!questionBox.value) questionBox.value = question;
    setStatus(message, true);
    endStream();
  }

  function endStream() {
    streaming = null;
    setBusy(false);
  }

  function setBusy(busy) {
    sendButton.disabled = busy || !socket;
    stopButton.hidden = !busy;
  }

  function setStatus(text, isError = false) {
    // Looked up each time: a saved setting's partial replaces the status line.
    const statusLine = $("chat-status");
    statusLine.textContent = text;
    statusLine.classList.toggle("error", isError);
  }

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const note = (text, extra = "muted") => element("p", `note ${extra}`, text);

  // Follow the answer down as it grows, unless the reader scrolled up to read something else.
  let following = true;
  const jumpButton = $("jump-latest");
  const nearBottom = () => messages.scrollHeight - messages.scrollTop - messages.clientHeight < 48;
  messages.addEventListener("scroll", () => {
    following = nearBottom();
    jumpButton.hidden = following;
  });
  function follow() {
    if (following) messages.scrollTop = messages.scrollHeight;
  }
  jumpButton.addEventListener("click", () => {
    following = true;
    follow();
  });

  // ---- Copy, regenerate, shortcuts ---------------------------------------------------------

  const latestAnswer = () => [...messages.querySelectorAll(".message-assistant")].pop();

  function answerText(article) {
    if (streaming && article === liveAnswer()) return streaming.text;
    const markdown = article.querySelector("template.answer-markdown");
    return markdown ? markdown.content.textContent : article.querySelector(".answer-body").innerText;
  }

  async function copyAnswer(article) {
    if (!article) return;
    try {
      await navigator.clipboard.writeText(answerText(article));
      setStatus("Answer copied to the clipboard.");
    } catch (error) {
      setStatus("The browser refused the clipboard; select the answer and copy it instead.", true);
    }
  }

  function regenerate(article) {
    if (!article || streaming) return;
    let question = article.previousElementSibling;
    while (question && !question.classList.contains("message-user")) question = question.previousElementSibling;
    if (!question) return setStatus("There is no question before this answer to ask again.", true);
    questionBox.value = question.querySelector(".message-body").textContent;
    form.requestSubmit();
  }

  const typing = (target) => target.closest("input, textarea, select, [contenteditable=true]");

  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      if (graphPanel.classList.contains("expanded")) return toggleEnlarged(false);
      if (streaming) return stop();
      return;
    }
    if (event.key === "/" && !typing(event.target) && !event.ctrlKey && !event.metaKey) {
      event.preventDefault();
      questionBox.focus();
      return;
    }
    if (!event.altKey || event.ctrlKey || event.metaKey) return;
    const actions = { KeyC: () => copyAnswer(latestAnswer()), KeyR: () => regenerate(latestAnswer()), KeyG: () => toggleEnlarged() };
    if (actions[event.code]) {
      event.preventDefault();
      actions[event.code]();
    }
  });

  // ---- Sources: the panel is the server's; the graph and the active answer follow it -------

  let activeArticle = null;
  let shownData = null;

  // The panel came in (with the page, over the socket, or by "Show sources"): draw its graph
  // and mark the answer it belongs to.
  function showSwappedSources() {
    const holder = $("sources-data");
    if (!holder || holder === shownData) return;
    shownData = holder;
    const data = JSON.parse(holder.textContent);
    const article = data.answer
      ? messages.querySelector(`.message-assistant[data-answer="${Number(data.answer)}"]`)
      : liveAnswer();
    activeArticle?.classList.remove("active");
    activeArticle = article;
    article?.classList.add("active");
    renderGraph(data.subgraph || {}, data.citations || [], data.cited || []);
  }
  document.body.addEventListener("htmx:afterSettle", showSwappedSources);

  messages.addEventListener("click", (event) => {
    const article = event.target.closest(".message-assistant");
    if (!article) return;
    if (event.target.closest(".copy-answer")) return copyAnswer(article);
    if (event.target.closest(".regenerate")) return regenerate(article);
    const cite = event.target.closest("a.cite");
    if (!cite) return;
    event.preventDefault();
    const sources = article.querySelector(".show-sources[hx-get]");
    if (article === activeArticle || !sources) return focusCitation(cite.dataset.cite);
    htmx.ajax("GET", sources.getAttribute("hx-get"), { target: "#sources", swap: "outerHTML" })
      .then(() => focusCitation(cite.dataset.cite));
  });

  function focusCitation(id) {
    const row = document.getElementById(`cite-${id}`);
    if (!row) return setStatus(`The answer cites ${id}, which is not among its sources.`, true);
    const folded = row.closest("details");
    if (folded) folded.open = true;
    for (const other of document.querySelectorAll("#citations-scroll .focused")) other.classList.remove("focused");
    row.classList.add("focused");
    row.scrollIntoView({ block: "center", behavior: "smooth" });
  }

  // A row of the panel opens its passage wherever it is clicked, and lights up its part of the graph.
  const sourcesPanel = document.querySelector(".chat-side");
  sourcesPanel.addEventListener("click", (event) => {
    const row = event.target.closest("#citations-scroll tr, #citations-scroll li");
    const link = row && row.querySelector("a[href]");
    if (link && !event.target.closest("a")) link.click();
  });
  sourcesPanel.addEventListener("mouseover", (event) => {
    const row = event.target.closest("#citations-scroll [data-cite]");
    if (row) highlightCitation(row.dataset.cite);
  });
  sourcesPanel.addEventListener("mouseout", (event) => {
    if (event.target.closest("#citations-scroll") && !event.relatedTarget?.closest("#citations-scroll")) {
      highlightCitation(null);
    }
  });
  messages.addEventListener("mouseover", (event) => {
    const marker = event.target.closest("a.cite, .answer-sources li[data-cite]");
    if (marker && marker.closest(".message-assistant") === activeArticle) highlightCitation(marker.dataset.cite);
  });
  messages.addEventListener("mouseout", (event) => {
    if (event.target.closest("a.cite, .answer-sources li[data-cite]")) highlightCitation(null);
  });

  // ---- Subgraph panel ---------------------------------------------------------------------

  // About thirty nodes are what a panel this size shows with labels one can read.
  const DEFAULT_NODES = 30;
  const graphPanel = $("graph-panel");
  const showAllButton = $("graph-show-all");
  const enlargeButton = $("graph-enlarge");
  const tooltip = $("graph-tooltip");
  let cy = null;
  let citationById = new Map();
  let drawn = { subgraph: { nodes: [], edges: [] }, cited: [], showAll: false, key: "" };

  function nodeElement(node, citedNodes) {
    const type = EntityPalette.normalize(node.type) || "untyped";
    const degree = Number(node.degree) || 0;
    return {
      group: "nodes",
      classes: citedNodes.has(String(node.id)) ? "cited" : "",
      data: {
        id: `n${node.id}`,
        entity: node.id,
        row: node.row || "",
        label: node.label || String(node.id),
        type,
        description: node.description || "",
        colour: EntityPalette.colourOf(type),
        size: Math.round(16 + 4 * Math.sqrt(Math.min(degree, 36))),
        rank: node.rank || 0,
      },
    };
  }

  function edgeElement(edge) {
    return {
      group: "edges",
      data: {
        id: `e${edge.id}`,
        row: edge.row || "",
        source: `n${edge.source}`,
        target: `n${edge.target}`,
        weight: Number(edge.weight) || 0,
        description: edge.description || "",
        keywords: edge.keywords || "",
      },
    };
  }

  function ensureGraph() {
    if (cy) return cy;
    cy = cytoscape({
      container: $("graph"),
      wheelSensitivity: 0.3,
      minZoom: 0.05,
      maxZoom: 3,
      style: [
        {
          selector: "node",
          style: {
            "background-color": "data(colour)", width: "data(size)", height: "data(size)",
            "border-width": 1, "border-color": "#ffffff",
          },
        },
        ...GraphLabels.style,
        { selector: "edge", style: { width: "data(width)", "line-color": "#aab3c0", "curve-style": "bezier", opacity: 0.8 } },
        { selector: "node.cited", style: { "border-width": 3, "border-color": "#1d2330", "font-weight": "bold" } },
        { selector: "node.picked", style: { "border-width": 4, "border-color": "#111827" } },
        { selector: "node.hovered", style: { "border-width": 4, "border-color": "#111827", "z-index": 10 } },
        { selector: "edge.hovered", style: { "line-color": "#111827", opacity: 1 } },
        { selector: ".faded", style: { opacity: 0.2 } },
        { selector: "node.fresh", style: { "border-width": 2, "border-style": "dashed", "border-color": "#111827" } },
      ],
    });
    // What the answer cites is labelled first, then the rest in the order it was drawn.
    GraphLabels.attach(cy, {
      rank: (node) => (node.hasClass("cited") ? 1e6 : 0) + (node.data("rank") || 0),
      together: "node.cited",
    });
    cy.on("mouseover", "node, edge", (event) => {
      showTooltip(event);
      if (event.target.isNode()) linkRows(event.target, "hover-linked");
    });
    cy.on("mouseout", "node, edge", () => {
      tooltip.hidden = true;
      clearRows("hover-linked");
    });
    cy.on("tap", "node", (event) => pickNode(event.target));
    cy.on("tap", (event) => event.target === cy && clearPick());
    cy.on("dbltap", "node", (event) => loadNeighbours(event.target));
    return cy;
  }

  // The nodes worth drawing first: entities the answer cites and the ends of relations it cites
  // (these two get the ring), the retrieved entities of the passages it cites, then the other
  // retrieved entities in retrieval order (best-ranked first), then the rest (endpoints, by degree).
  function nodeOrder(subgraph, citations, cited) {
    const nodes = subgraph.nodes || [];
    const edges = subgraph.edges || [];
    const citedSet = new Set(cited);
    const byRow = new Map(citations.map((citation) => [citation.id, citation]));
    const citedChunks = new Set(
      cited.map((id) => byRow.get(id)).filter((c) => c && c.kind === "source" && c.chunk_id).map((c) => c.chunk_id),
    );
    const fromCitedChunk = (row) => row && citedChunks.has(byRow.get(row)?.chunk_id);
    const order = new Map();
    const add = (id, isCited) => {
      const key = String(id);
      if (!order.has(key)) order.set(key, isCited);
    };
    for (const node of nodes) if (node.row && citedSet.has(node.row)) add(node.id, true);
    for (const edge of edges) if (edge.row && citedSet.has(edge.row)) [edge.source, edge.target].forEach((id) => add(id, true));
    for (const node of nodes) if (fromCitedChunk(node.row)) add(node.id, false);
    for (const edge of edges) if (fromCitedChunk(edge.row)) [edge.source, edge.target].forEach((id) => add(id, false));
    for (const node of nodes) if (node.row) add(node.id, false);
    for (const node of nodes) add(node.id, false);
    return order;
  }

  // The same subgraph again (its answer finished, now citing rows) keeps "Show all" as it was.
  function renderGraph(subgraph, citations, cited) {
    const nodes = JSON.stringify((subgraph.nodes || []).map((node) => node.id));
    const key = JSON.stringify([nodes, (subgraph.edges || []).length, cited]);
    if (drawn.key === key) return;
    drawn = { subgraph, cited, showAll: drawn.nodes === nodes ? drawn.showAll : false, key, nodes };
    citationById = new Map(citations.map((citation) => [citation.id, citation]));
    drawSubgraph();
  }

  function drawSubgraph() {
    const graph = ensureGraph();
    const { subgraph, cited, showAll } = drawn;
    const order = nodeOrder(subgraph, [...citationById.values()], cited);
    const limit = showAll ? Infinity : DEFAULT_NODES;
    const chosen = new Set([...order.keys()].slice(0, limit));
    const ranks = new Map([...order.keys()].map((id, index) => [id, order.size - index]));
    const citedNodes = new Set([...order.entries()].filter(([, isCited]) => isCited).map(([id]) => id));
    graph.elements().remove();
    tooltip.hidden = true;
    addElements(
      (subgraph.nodes || []).filter((node) => chosen.has(String(node.id))).map((node) => ({ ...node, rank: ranks.get(String(node.id)) })),
      subgraph.edges || [],
      citedNodes,
    );
    layout();
    const total = (subgraph.nodes || []).length;
    showAllButton.hidden = total <= DEFAULT_NODES;
    showAllButton.textContent = showAll ? `Show the top ${DEFAULT_NODES}` : `Show all ${total}`;
    showAllButton.setAttribute("aria-pressed", String(showAll));
    updateGraphSummary(total);
  }

  showAllButton.addEventListener("click", () => {
    drawn.showAll = !drawn.showAll;
    drawSubgraph();
  });

  function addElements(nodes, edges, citedNodes = new Set()) {
    const additions = [];
    for (const node of nodes) if (!cy.getElementById(`n${node.id}`).length) additions.push(nodeElement(node, citedNodes));
    const present = new Set([...cy.nodes().map((node) => node.id()), ...additions.map((node) => node.data.id)]);
    for (const edge of edges) {
      const element = edgeElement(edge);
      if (present.has(element.data.source) && present.has(element.data.target) && !cy.getElementById(element.data.id).length) {
        additions.push(element);
      }
    }
    const added = cy.add(additions);
    scaleEdges();
    updateLegend();
    return added;
  }

  function scaleEdges() {
    const weights = cy.edges().map((edge) => edge.data("weight"));
    const low = Math.min(...weights);
    const high = Math.max(...weights);
    cy.edges().forEach((edge) => {
      const share = high > low ? (edge.data("weight") - low) / (high - low) : 0.5;
      edge.data("width", 1 + share * 5);
    });
  }

  // Long, slack edges between two hubs and short, stiff ones around each hub pull the clusters
  // apart (benchmarks/layout.py: further apart than plain fcose, a little closer than cose).
  // Labels take no room in the layout: static/js/labels.js shows those that fit afterwards.
  const bridge = (edge) => edge.source().degree() > 3 && edge.target().degree() > 3;
  function layout() {
    const nodes = cy.nodes().length;
    const options = nodes > 1
      ? {
        name: "fcose", quality: "proof", randomize: true, animate: false, fit: true, padding: 40,
        nodeSeparation: 90, packComponents: true, tile: true,
        idealEdgeLength: (edge) => (bridge(edge) ? 250 : 40),
        edgeElasticity: (edge) => (bridge(edge) ? 0.05 : 0.6),
        nodeRepulsion: 4500, gravity: 0.1,
      }
      : { name: "grid", fit: true, padding: 40 };
    // Every node fits in the panel (labels stay readable at any zoom: static/js/labels.js), and
    // a graph of two or three nodes is not blown up to fill it.
    cy.layout(options).run();
    if (cy.zoom() > 1.5) {
      cy.zoom(1.5);
      cy.center();
    }
  }

  function toggleEnlarged(force) {
    const expanded = force ?? !graphPanel.classList.contains("expanded");
    graphPanel.classList.toggle("expanded", expanded);
    document.body.classList.toggle("graph-enlarged", expanded);
    enlargeButton.textContent = expanded ? "Close (Esc)" : "Enlarge";
    enlargeButton.setAttribute("aria-pressed", String(expanded));
    tooltip.hidden = true;
    if (cy) {
      cy.resize();
      cy.fit(undefined, 40);
    }
    enlargeButton.focus();
  }
  enlargeButton.addEventListener("click", () => toggleEnlarged());

  function updateLegend() {
    const counts = new Map();
    cy.nodes().forEach((node) => counts.set(node.data("type"), (counts.get(node.data("type")) || 0) + 1));
    EntityPalette.renderLegend($("graph-legend"), counts);
  }

  function updateGraphSummary(total) {
    const nodes = cy.nodes().length;
    const of = total > nodes ? ` of ${total}` : "";
    $("graph-summary").textContent = nodes ? `${nodes}${of} entities · ${cy.edges().length} relations` : "nothing retrieved";
  }

  // A node's citations: its own entity row, the rows of the relations drawn at it, and the
  // source passages those rows were taken from.
  function citationsOf(node) {
    const ids = new Set([node.data("row"), ...node.connectedEdges().map((edge) => edge.data("row"))].filter(Boolean));
    const chunks = new Set([...ids].map((id) => citationById.get(id)?.chunk_id).filter(Boolean));
    for (const citation of citationById.values()) {
      if (citation.kind === "source" && chunks.has(citation.chunk_id)) ids.add(citation.id);
    }
    return ids;
  }

  // The drawn nodes (and edges) a citation stands for: its entity, its relation with both
  // ends, or for a passage every drawn row taken from that passage.
  function elementsOf(id) {
    const citation = citationById.get(id);
    const chunk = citation && citation.kind === "source" ? citation.chunk_id : null;
    const matches = (element) => {
      const row = element.data("row");
      return row && (row === id || (chunk && citationById.get(row)?.chunk_id === chunk));
    };
    const edges = cy.edges().filter(matches);
    return cy.nodes().filter(matches).union(edges).union(edges.connectedNodes());
  }

  function highlightCitation(id) {
    if (!cy) return;
    cy.elements().removeClass("hovered");
    if (id) elementsOf(id).addClass("hovered");
  }

  function linkRows(node, className) {
    const ids = citationsOf(node);
    let first = null;
    for (const row of $("citations-scroll").querySelectorAll("[data-cite]")) {
      const hit = ids.has(row.dataset.cite);
      row.classList.toggle(className, hit);
      if (hit && !first) first = row;
    }
    return { ids, first };
  }

  function clearRows(className) {
    for (const row of $("citations-scroll").querySelectorAll(`.${className}`)) row.classList.remove(className);
  }

  function pickNode(node) {
    clearPick();
    node.addClass("picked");
    cy.elements().not(node.closedNeighborhood()).addClass("faded");
    const { ids, first } = linkRows(node, "linked");
    if (first?.closest("details")) first.closest("details").open = true;
    first?.scrollIntoView({ block: "nearest", behavior: "smooth" });
    setStatus(ids.size ? `${node.data("label")}: ${ids.size} citation(s) highlighted.` : `${node.data("label")}: no citation of this answer mentions it.`);
  }

  function clearPick() {
    cy.elements().removeClass("picked faded");
    clearRows("linked");
  }

  function showTooltip(event) {
    const target = event.target;
    const title = target.isNode()
      ? `${target.data("label")} (${target.data("type")})`
      : `${target.source().data("label")} – ${target.target().data("label")}`;
    const lines = [element("strong", "", title)];
    if (target.isEdge() && target.data("keywords")) lines.push(element("p", "keywords", target.data("keywords")));
    lines.push(element("p", "", target.data("description") || "No description."));
    tooltip.replaceChildren(...lines);
    const position = event.renderedPosition || (target.isNode() ? target.renderedPosition() : target.renderedMidpoint());
    tooltip.style.left = `${Math.round(position.x + 12)}px`;
    tooltip.style.top = `${Math.round(position.y + 12)}px`;
    tooltip.hidden = false;
  }

  async function loadNeighbours(node) {
    const url = new URL(config.neighboursUrl, location.href);
    url.searchParams.set("entity", node.data("entity"));
    setStatus(`Loading the neighbours of ${node.data("label")}…`);
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(response.status === 404 ? "that entity no longer exists" : `HTTP ${response.status}`);
      const neighbours = await response.json();
      const added = addElements(neighbours.nodes || [], neighbours.edges || []);
      added.nodes().addClass("fresh");
      layout();
      updateGraphSummary((drawn.subgraph.nodes || []).length);
      setStatus(`${added.nodes().length} new neighbour(s) of ${node.data("label")}.`);
    } catch (error) {
      setStatus(`Could not load neighbours: ${error.message}.`, true);
    }
  }

  // ---- Start ------------------------------------------------------------------------------

  // The browser test (and anyone debugging in the console) reads the graph through this.
  window.chatGraph = () => cy;
  showSwappedSources();
  messages.scrollTop = messages.scrollHeight;
})();
