// The chat page: websocket client, streaming markdown, the subgraph panel and the citations.
//
// Everything that arrives from the server is untrusted text (model output, document
// excerpts, entity descriptions). Answers are rendered by markdown-it with raw HTML off and
// then cleaned by DOMPurify with an allow-list; everything else goes in through textContent.
(function () {
  "use strict";

  const config = JSON.parse(document.getElementById("chat-config").textContent);
  const answers = new Map(
    JSON.parse(document.getElementById("chat-answers").textContent).map((answer) => [String(answer.id), answer]),
  );

  const $ = (id) => document.getElementById(id);
  const messages = $("messages");
  const form = $("ask-form");
  const questionBox = $("ask-question");
  const modeSelect = $("ask-mode");
  const sendButton = $("ask-send");
  const stopButton = $("ask-stop");
  const statusLine = $("chat-status");
  const citationsBody = document.querySelector("#citations tbody");

  // ---- Markdown, the same rules as chat/rendering.py ----------------------------------

  const SAFE_URL = /^(?:(?:https?|mailto):|#)/i;
  const CITATION = /\[((?:[SER]\d+)(?:\s*[,;]\s*[SER]\d+)*)\]/g;
  const ALLOWED_TAGS = [
    "p", "br", "hr", "strong", "em", "s", "del", "code", "pre", "blockquote", "ul", "ol", "li",
    "h1", "h2", "h3", "h4", "h5", "h6", "a", "table", "thead", "tbody", "tr", "th", "td",
  ];

  const md = window.markdownit({ html: false, linkify: false, typographer: false });
  md.disable("image");
  md.validateLink = (url) => SAFE_URL.test(url.trim());
  md.core.ruler.push("citation_links", (state) => {
    for (const block of state.tokens) {
      if (block.type !== "inline" || !block.children) continue;
      const children = [];
      let insideLink = 0;
      for (const token of block.children) {
        if (token.type === "link_open") insideLink += 1;
        if (token.type === "link_close") insideLink -= 1;
        if (token.type !== "text" || insideLink || !token.content.match(CITATION)) {
          children.push(token);
          continue;
        }
        children.push(...splitCitations(state, token.content));
      }
      block.children = children;
    }
  });

  function splitCitations(state, text) {
    const tokens = [];
    const textToken = (content) => Object.assign(new state.Token("text", "", 0), { content });
    let position = 0;
    for (const match of text.matchAll(CITATION)) {
      if (match.index > position) tokens.push(textToken(text.slice(position, match.index)));
      match[1].match(/[SER]\d+/g).forEach((id, index) => {
        if (index) tokens.push(textToken(" "));
        const open = new state.Token("link_open", "a", 1);
        open.attrs = [["href", `#cite-${id}`], ["class", "cite"], ["data-cite", id]];
        tokens.push(open, textToken(`[${id}]`), new state.Token("link_close", "a", -1));
      });
      position = match.index + match[0].length;
    }
    if (position < text.length) tokens.push(textToken(text.slice(position)));
    return tokens;
  }

  function clean(html) {
    return DOMPurify.sanitize(html, {
      ALLOWED_TAGS,
      ALLOWED_ATTR: ["href", "title", "class", "data-cite", "start", "rel"],
      ALLOWED_URI_REGEXP: SAFE_URL,
    });
  }

  const renderMarkdown = (text) => clean(md.render(text));

  // ---- The socket ----------------------------------------------------------------------

  let socket = null;
  let reconnectDelay = 500;
  let streaming = null;

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}${config.socketPath}`);
    socket.addEventListener("open", () => {
      reconnectDelay = 500;
      setStatus("Ready.");
      setBusy(false);
    });
    socket.addEventListener("message", (event) => handle(JSON.parse(event.data)));
    socket.addEventListener("close", (event) => {
      sendButton.disabled = true;
      if (streaming) failStream("The connection dropped before the answer was complete.");
      if (event.code === 4401) return setStatus("Your session has ended: reload the page and log in again.", true);
      if (event.code === 4403) return setStatus("You are not a member of this workspace.", true);
      setStatus("Connection lost; reconnecting…", true);
      setTimeout(connect, reconnectDelay);
      reconnectDelay = Math.min(reconnectDelay * 2, 10000);
    });
  }

  function send(message) {
    if (!socket || socket.readyState !== WebSocket.OPEN) {
      setStatus("Not connected yet; try again in a moment.", true);
      return false;
    }
    socket.send(JSON.stringify(message));
    return true;
  }

  // URLs come from Django's reverse() with 0 as the id; the id is the last path segment.
  const withId = (url, id) => url.replace(/\/0\/$/, `/${Number(id)}/`);

  function handle(event) {
    if (event.conversation && !config.conversation) adoptConversation(event.conversation);
    switch (event.type) {
      case "retrieval": return onRetrieval(event);
      case "token": return onToken(event);
      case "done": return onDone(event);
      case "error": return onError(event);
    }
  }

  function adoptConversation(id) {
    config.conversation = id;
    const heading = document.querySelector("#conversation-header h1");
    if (heading && streaming) heading.textContent = streaming.question.split(/\s+/).join(" ").slice(0, 80);
    history.replaceState(null, "", withId(config.conversationUrl, id));
  }

  // ---- Asking and streaming --------------------------------------------------------------

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (streaming) return;
    const question = questionBox.value.trim();
    if (!question) return setStatus("Type a question first.", true);
    const ask = { type: "ask", question, mode: modeSelect.value };
    if (config.conversation) ask.conversation = config.conversation;
    if (!send(ask)) return;
    $("chat-empty")?.remove();
    messages.append(userMessage(question));
    const article = assistantMessage(modeSelect.value);
    messages.append(article);
    streaming = { article, body: article.querySelector(".answer-body"), text: "", question, frame: 0 };
    article.scrollIntoView({ block: "end", behavior: "smooth" });
    questionBox.value = "";
    setBusy(true);
    setStatus("Searching the knowledge graph…");
  });

  questionBox.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  stopButton.addEventListener("click", () => {
    if (streaming && send({ type: "cancel" })) setStatus("Stopping…");
  });

  modeSelect.addEventListener("change", () => {
    $("mode-explanation").textContent = modeSelect.selectedOptions[0].dataset.explanation;
  });

  function onRetrieval(event) {
    if (!streaming) return;
    streaming.sources = { subgraph: event.subgraph, citations: event.citations, keywords: event.keywords };
    showSources(streaming.sources, streaming.article);
    const total = event.timings && event.timings.total;
    setStatus(total ? `Sources found in ${Math.round(total)} ms; answering…` : "Answering…");
    streaming.body.classList.add("streaming");
  }

  function onToken(event) {
    if (!streaming) return;
    streaming.text += event.text;
    // One render per frame however fast tokens arrive; markdown needs the whole text
    // each time (a table or list changes shape as it grows).
    if (!streaming.frame) {
      streaming.frame = requestAnimationFrame(() => {
        if (!streaming) return;
        streaming.frame = 0;
        streaming.body.innerHTML = renderMarkdown(streaming.text);
      });
    }
  }

  function onDone(event) {
    if (!streaming) return;
    const { article, body, sources } = streaming;
    cancelAnimationFrame(streaming.frame);
    body.classList.remove("streaming");
    body.innerHTML = clean(event.html);
    if (event.message) {
      article.dataset.message = article.dataset.answer = event.message;
      if (sources) answers.set(String(event.message), sources);
    }
    const meta = article.querySelector(".message-meta");
    if (event.extractive) meta.insertBefore(badge("extractive answer", "badge-warn"), meta.lastElementChild);
    if (event.stopped) meta.insertBefore(badge("stopped", "badge-muted"), meta.lastElementChild);
    if (event.stopped && !event.message) {
      body.replaceChildren(note("Stopped before the answer began; nothing was saved."));
    }
    const usage = event.usage || {};
    const tokens = (usage.prompt_tokens || 0) + (usage.completion_tokens || 0);
    setStatus(event.stopped ? "Stopped." : tokens ? `Done · ${tokens} tokens.` : "Done.");
    endStream();
  }

  function onError(event) {
    if (streaming) return failStream(event.message);
    setStatus(event.message, true);
  }

  function failStream(message) {
    const { article, body, question } = streaming;
    cancelAnimationFrame(streaming.frame);
    body.classList.remove("streaming");
    article.classList.add("message-error");
    body.append(note(message, "error"));
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
    sendButton.disabled = busy || !socket || socket.readyState !== WebSocket.OPEN;
    stopButton.hidden = !busy;
  }

  function setStatus(text, isError = false) {
    statusLine.textContent = text;
    statusLine.classList.toggle("error", isError);
  }

  function userMessage(question) {
    const article = element("article", "message message-user");
    article.append(element("div", "message-body", question));
    return article;
  }

  function assistantMessage(mode) {
    const article = element("article", "message message-assistant");
    const meta = element("header", "message-meta");
    meta.append(badge(mode));
    const show = element("button", "link show-sources", "Show sources");
    show.type = "button";
    meta.append(show);
    const body = element("div", "message-body answer-body");
    body.append(note("Searching…"));
    article.append(meta, body);
    return article;
  }

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const badge = (text, extra = "") => element("span", `badge ${extra}`.trim(), text);
  const note = (text, extra = "muted") => element("p", `note ${extra}`, text);

  // ---- Sources: which answer the right-hand panels show ------------------------------------

  let activeArticle = null;

  function showSources(sources, article) {
    activeArticle?.classList.remove("active");
    activeArticle = article;
    article?.classList.add("active");
    renderCitations(sources.citations || []);
    renderGraph(sources.subgraph || {}, sources.citations || []);
    const keywords = sources.keywords || {};
    const words = [...(keywords.low_level || keywords.low || []), ...(keywords.high_level || keywords.high || [])];
    $("keywords").textContent = words.length ? `keywords: ${words.join(", ")}` : "";
  }

  function sourcesOf(article) {
    if (streaming && streaming.article === article) return streaming.sources;
    return answers.get(article.dataset.answer || "");
  }

  messages.addEventListener("click", (event) => {
    const article = event.target.closest(".message-assistant");
    if (!article) return;
    const cite = event.target.closest("a.cite");
    if (event.target.closest(".show-sources") || cite) {
      event.preventDefault();
      const sources = sourcesOf(article);
      if (!sources) return;
      if (article !== activeArticle) showSources(sources, article);
      if (cite) focusCitation(cite.dataset.cite);
    }
  });

  function focusCitation(id) {
    const row = document.getElementById(`cite-${id}`);
    if (!row) return setStatus(`The answer cites ${id}, which is not among its sources.`, true);
    for (const other of citationsBody.querySelectorAll("tr.focused")) other.classList.remove("focused");
    row.classList.add("focused");
    row.scrollIntoView({ block: "center", behavior: "smooth" });
  }

  // ---- Citations table -------------------------------------------------------------------

  // The document page highlights the chunk a citation points at (?chunk=<id>) and jumps to its
  // page or section (#page-4, #section-3) when the citation knows it.
  function chunkHref(citation) {
    if (!citation.chunk_id || !citation.document_id) return null;
    const url = new URL(withId(config.documentUrl, citation.document_id), location.href);
    url.searchParams.set("chunk", Number(citation.chunk_id));
    const anchor = /^(page|slide|sheet|section)-\d+$/.test(citation.anchor || "") ? citation.anchor : "";
    url.hash = anchor || `chunk-${Number(citation.chunk_id)}`;
    return url.href;
  }

  // "report.pdf, p. 4, 2.3 Dual-level retrieval"
  function citationPlace(citation) {
    return [citation.document_title || "document", citation.location, citation.section].filter(Boolean).join(", ");
  }

  function renderCitations(citations) {
    citationsBody.replaceChildren();
    for (const citation of citations) {
      const row = element("tr", `kind-${String(citation.kind || "").toLowerCase()}`);
      row.id = `cite-${citation.id}`;
      row.dataset.cite = citation.id;
      const href = chunkHref(citation);
      const documentCell = element("td", "citation-document");
      if (href) {
        const link = element("a", "", citationPlace(citation));
        link.href = href;
        link.target = "_blank";
        link.rel = "noopener";
        documentCell.append(link);
        row.classList.add("openable");
        row.title = "Open the passage in its document";
      } else {
        documentCell.textContent = citation.document_title ? citationPlace(citation) : "";
      }
      row.append(
        element("td", "citation-id", citation.id),
        element("td", "citation-kind", citation.kind || ""),
        documentCell,
        excerptCell(citation.excerpt || ""),
      );
      citationsBody.append(row);
    }
    $("citations-empty").hidden = citations.length > 0;
  }

  function excerptCell(text) {
    const cell = element("td", "citation-excerpt");
    cell.append(element("div", "excerpt", text));
    cell.title = text;
    return cell;
  }

  citationsBody.addEventListener("click", (event) => {
    const row = event.target.closest("tr");
    const link = row && row.querySelector("a[href]");
    if (link && event.target !== link) link.click();
  });

  // ---- Subgraph panel ---------------------------------------------------------------------

  const TYPE_COLOURS = {
    person: "#2f6fdb", organization: "#c2410c", location: "#15803d", event: "#a21caf",
    product: "#0e7490", technology: "#4338ca", concept: "#b45309", date: "#64748b",
  };
  const SPARE_COLOURS = ["#be123c", "#0f766e", "#7c3aed", "#65a30d", "#0369a1", "#9f1239", "#854d0e"];

  function colourOf(type) {
    const key = String(type || "unknown").toLowerCase();
    if (TYPE_COLOURS[key]) return TYPE_COLOURS[key];
    let hash = 0;
    for (const char of key) hash = (hash * 31 + char.charCodeAt(0)) >>> 0;
    return SPARE_COLOURS[hash % SPARE_COLOURS.length];
  }

  let cy = null;
  let citationById = new Map();
  const tooltip = $("graph-tooltip");

  function nodeElement(node) {
    const type = String(node.type || "unknown").toLowerCase();
    const rank = Number(node.rank) || 0;
    return {
      group: "nodes",
      data: {
        id: `n${node.id}`,
        entity: node.id,
        row: node.row || "",
        label: node.label || String(node.id),
        type,
        description: node.description || "",
        colour: colourOf(type),
        size: Math.round(14 + 4 * Math.sqrt(Math.min(rank, 36))),
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
      minZoom: 0.2,
      maxZoom: 3,
      style: [
        {
          selector: "node",
          style: {
            "background-color": "data(colour)", label: "data(label)", "font-size": 10, color: "#1d2330",
            "text-valign": "bottom", "text-margin-y": 3, width: "data(size)", height: "data(size)",
            "text-wrap": "ellipsis", "text-max-width": 110,
          },
        },
        { selector: "edge", style: { width: "data(width)", "line-color": "#b8c0cc", "curve-style": "bezier", opacity: 0.85 } },
        { selector: "node.picked", style: { "border-width": 3, "border-color": "#111827" } },
        { selector: ".faded", style: { opacity: 0.25 } },
        { selector: "node.fresh", style: { "border-width": 2, "border-style": "dashed", "border-color": "#111827" } },
      ],
    });
    cy.on("mouseover", "node, edge", (event) => showTooltip(event));
    cy.on("mouseout", "node, edge", () => (tooltip.hidden = true));
    cy.on("tap", "node", (event) => pickNode(event.target));
    cy.on("tap", (event) => event.target === cy && clearPick());
    cy.on("dbltap", "node", (event) => loadNeighbours(event.target));
    return cy;
  }

  function renderGraph(subgraph, citations) {
    const graph = ensureGraph();
    graph.elements().remove();
    tooltip.hidden = true;
    citationById = new Map(citations.map((citation) => [citation.id, citation]));
    addElements(subgraph.nodes || [], subgraph.edges || []);
    layout();
    updateGraphSummary();
  }

  function addElements(nodes, edges) {
    const additions = [];
    for (const node of nodes) if (!cy.getElementById(`n${node.id}`).length) additions.push(nodeElement(node));
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
      edge.data("width", 1 + share * 6);
    });
  }

  function layout() {
    cy.layout({ name: cy.nodes().length > 1 ? "cose" : "grid", animate: false, fit: true, padding: 24, nodeRepulsion: 9000 }).run();
  }

  function updateLegend() {
    const legend = $("graph-legend");
    legend.replaceChildren();
    const types = [...new Set(cy.nodes().map((node) => node.data("type")))].sort();
    for (const type of types) {
      const item = element("li", "", type);
      const dot = element("span", "dot");
      dot.style.background = colourOf(type);
      item.prepend(dot);
      legend.append(item);
    }
  }

  function updateGraphSummary() {
    const nodes = cy.nodes().length;
    $("graph-summary").textContent = nodes ? `${nodes} entities · ${cy.edges().length} relations` : "nothing retrieved";
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

  function pickNode(node) {
    clearPick();
    node.addClass("picked");
    cy.elements().not(node.closedNeighborhood()).addClass("faded");
    const ids = citationsOf(node);
    let first = null;
    for (const row of citationsBody.rows) {
      const hit = ids.has(row.dataset.cite);
      row.classList.toggle("linked", hit);
      if (hit && !first) first = row;
    }
    first?.scrollIntoView({ block: "nearest", behavior: "smooth" });
    setStatus(ids.size ? `${node.data("label")}: ${ids.size} citation(s) highlighted.` : `${node.data("label")}: no citation of this answer mentions it.`);
  }

  function clearPick() {
    cy.elements().removeClass("picked faded");
    for (const row of citationsBody.querySelectorAll("tr.linked")) row.classList.remove("linked");
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
      updateGraphSummary();
      setStatus(`${added.nodes().length} new neighbour(s) of ${node.data("label")}.`);
    } catch (error) {
      setStatus(`Could not load neighbours: ${error.message}.`, true);
    }
  }

  // ---- Start ------------------------------------------------------------------------------

  // The browser test (and anyone debugging in the console) reads the graph through this.
  window.chatGraph = () => cy;
  const lastAnswer = [...messages.querySelectorAll(".message-assistant")].pop();
  if (lastAnswer && answers.has(lastAnswer.dataset.answer)) showSources(answers.get(lastAnswer.dataset.answer), lastAnswer);
  lastAnswer?.scrollIntoView({ block: "end" });
  connect();
})();
