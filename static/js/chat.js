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
  md.validateLink = (url) => SAFE_URL.test(url.trim());
  // As chat/rendering.py: an image is its alt text, so no answer makes a reader's browser
  // fetch an address a model (or a poisoned document) chose.
  md.core.ruler.push("images_as_text", (state) => {
    for (const block of state.tokens) {
      if (block.type !== "inline" || !block.children) continue;
      block.children = block.children.map((token) =>
        token.type === "image" ? Object.assign(new state.Token("text", "", 0), { content: token.content }) : token);
    }
  });
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
      // A marker of a row the context never held is invented: it goes, as on the server.
      const known = state.env.citationIds;
      match[1].match(/[SER]\d+/g).filter((id) => !known || known.has(id)).forEach((id, index) => {
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

  const renderMarkdown = (text, citations) =>
    clean(md.render(text, citations ? { citationIds: new Set(citations.map((row) => String(row.id))) } : {}));

  // A whole message rendered by the server (chat/_message.html): the answer inside it was
  // already cleaned by nh3; this pass keeps the page safe should that ever change.
  const SAFE_MESSAGE_URL = /^(?:(?:https?|mailto):|#|\/(?!\/))/i;
  function cleanMessage(html) {
    return DOMPurify.sanitize(html, {
      ALLOWED_TAGS: [...ALLOWED_TAGS, "article", "header", "footer", "span", "button", "div"],
      ALLOWED_ATTR: [
        "href", "title", "class", "data-cite", "start", "rel", "target", "type",
        "data-message", "data-answer", "aria-label",
      ],
      ALLOWED_URI_REGEXP: SAFE_MESSAGE_URL,
    });
  }

  // The rows an answer cites, in the order it first cites them (its [S2]-style markers); their
  // citations carry the cited sentence once the answer is done.
  function citedIds(sources) {
    const ids = [];
    for (const match of String(sources.content || "").matchAll(CITATION)) ids.push(...match[1].match(/[SER]\d+/g));
    return [...new Set(ids)];
  }

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

  // ---- Settings: sent with every question, remembered for the user --------------------------

  const settingFields = [modeSelect, $("ask-response-type"), $("ask-top-k"), $("ask-chunk-top-k")];
  const csrfToken = JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"] || "";

  function currentSettings() {
    return {
      mode: modeSelect.value,
      response_type: $("ask-response-type").value,
      top_k: Number($("ask-top-k").value),
      chunk_top_k: Number($("ask-chunk-top-k").value),
    };
  }

  async function saveSettings() {
    const invalid = settingFields.find((field) => !field.checkValidity());
    if (invalid) return setStatus(`${invalid.labels[0].textContent.trim()}: ${invalid.validationMessage}`, true);
    const body = new FormData();
    for (const [name, value] of Object.entries(currentSettings())) body.append(name, value);
    try {
      const response = await fetch(config.preferencesUrl, {
        method: "POST", body, credentials: "same-origin", headers: { "X-CSRFToken": csrfToken },
      });
      if (!response.ok) throw new Error((await response.json().catch(() => ({}))).error || `HTTP ${response.status}`);
      setStatus("Settings saved; they apply to your next questions.");
    } catch (error) {
      setStatus(`Could not save the settings: ${error.message}`, true);
    }
  }

  for (const field of settingFields) field.addEventListener("change", saveSettings);

  function explainMode() {
    const option = modeSelect.selectedOptions[0];
    const off = [...modeSelect.options].filter((item) => item.disabled);
    const notes = off.map((item) => `${item.textContent.replace(/ \(.*\)$/, "")} is off: ${item.dataset.unavailable}`);
    $("mode-explanation").textContent = [option.dataset.explanation, ...notes].join(" ");
  }
  modeSelect.addEventListener("change", explainMode);

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

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (streaming) return;
    const question = questionBox.value.trim();
    if (!question) return setStatus("Type a question first.", true);
    const invalid = settingFields.find((field) => !field.checkValidity());
    if (invalid) return setStatus(`${invalid.labels[0].textContent.trim()}: ${invalid.validationMessage}`, true);
    const settings = currentSettings();
    const ask = { type: "ask", question, ...settings, filters: scopeFilters() };
    if (config.conversation) ask.conversation = config.conversation;
    if (!send(ask)) return;
    $("chat-empty")?.remove();
    messages.append(userMessage(question));
    const article = assistantMessage(settings.mode);
    messages.append(article);
    streaming = { article, body: article.querySelector(".answer-body"), text: "", question, frame: 0 };
    following = true;
    follow();
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

  stopButton.addEventListener("click", stop);

  function stop() {
    if (streaming && send({ type: "cancel" })) setStatus("Stopping…");
  }

  function onRetrieval(event) {
    if (!streaming) return;
    streaming.sources = {
      subgraph: event.subgraph, citations: event.citations, keywords: event.keywords, content: "",
    };
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
        streaming.body.innerHTML = renderMarkdown(streaming.text, streaming.sources && streaming.sources.citations);
        follow();
      });
    }
  }

  function onDone(event) {
    if (!streaming) return;
    const { body, sources, text } = streaming;
    let { article } = streaming;
    cancelAnimationFrame(streaming.frame);
    body.classList.remove("streaming");
    if (event.message && event.message_html) {
      // The answer as a reload will show it: the same template, the cited sources under it.
      const holder = document.createElement("template");
      holder.innerHTML = cleanMessage(event.message_html);
      const rendered = holder.content.querySelector("article");
      if (rendered) {
        article.replaceWith(rendered);
        if (activeArticle === article) activeArticle = rendered;
        article = rendered;
        // Feedback needs the page's session (a CSRF-protected form), so it comes in its own request.
        const slot = rendered.querySelector(".answer-feedback-slot");
        if (slot) htmx.ajax("GET", config.feedbackUrl.replace("/0/", `/${event.message}/`), { target: slot, swap: "innerHTML" });
      }
    } else {
      body.innerHTML = clean(event.html || "");
      if (event.message) article.dataset.message = article.dataset.answer = event.message;
      const meta = article.querySelector(".message-meta");
      if (event.stopped) meta.insertBefore(badge("stopped", "badge-muted"), meta.querySelector(".message-tools"));
    }
    if (event.message && sources) {
      // `done` brings the citations again, now with the sentences the answer cites.
      Object.assign(sources, { content: text, citations: event.citations || sources.citations });
      answers.set(String(event.message), sources);
      if (activeArticle === article || !activeArticle) showSources(sources, article, { keepGraph: true });
    }
    if (event.stopped && !event.message) {
      article.querySelector(".answer-body").replaceChildren(note("Stopped before the answer began; nothing was saved."));
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

  // Live messages are copies of the server's own template (chat/_message.html), so a reload
  // shows them the same.
  const fromTemplate = (id) => $(id).content.querySelector("article").cloneNode(true);

  function userMessage(question) {
    const article = fromTemplate("question-template");
    article.querySelector(".message-body").textContent = question;
    return article;
  }

  function assistantMessage(mode) {
    const article = fromTemplate("answer-template");
    article.querySelector(".badge-mode").textContent = mode;
    article.querySelector(".answer-body").replaceChildren(note("Searching…"));
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

  // ---- Copy, regenerate, shortcuts ---------------------------------------------------------

  const latestAnswer = () => [...messages.querySelectorAll(".message-assistant")].pop();

  function answerText(article) {
    if (streaming && streaming.article === article) return streaming.text;
    const saved = answers.get(article.dataset.answer || "");
    return saved && saved.content ? saved.content : article.querySelector(".answer-body").innerText;
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

  // ---- Sources: which answer the right-hand panels show ------------------------------------

  let activeArticle = null;
  let activeSources = null;

  function showSources(sources, article, { keepGraph = false } = {}) {
    activeArticle?.classList.remove("active");
    activeArticle = article;
    article?.classList.add("active");
    activeSources = sources;
    const cited = citedIds(sources);
    renderCitations(sources, cited);
    renderGraph(sources.subgraph || {}, sources.citations || [], cited, { keepIfSame: keepGraph });
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
    if (event.target.closest(".copy-answer")) return copyAnswer(article);
    if (event.target.closest(".regenerate")) return regenerate(article);
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
    const folded = row.closest("details");
    if (folded) folded.open = true;
    for (const other of document.querySelectorAll("#citations-scroll .focused")) other.classList.remove("focused");
    row.classList.add("focused");
    row.scrollIntoView({ block: "center", behavior: "smooth" });
  }

  // ---- Citations: the cited sources first, everything else folded ---------------------------

  // The document page shades the chunk (?chunk=<id>), marks the sentence (&start=&end=) and
  // jumps to the chunk's page or section (#page-4, #section-3) when the citation knows it.
  function chunkHref(citation) {
    if (!citation.chunk_id || !citation.document_id) return null;
    const url = new URL(withId(config.documentUrl, citation.document_id), location.href);
    url.searchParams.set("chunk", Number(citation.chunk_id));
    if (Number.isInteger(citation.sentence_start) && Number.isInteger(citation.sentence_end)) {
      url.searchParams.set("start", citation.sentence_start);
      url.searchParams.set("end", citation.sentence_end);
    }
    const anchor = /^(page|slide|sheet|section)-\d+$/.test(citation.anchor || "") ? citation.anchor : "";
    url.hash = anchor || `chunk-${Number(citation.chunk_id)}`;
    return url.href;
  }

  function documentLink(citation, text) {
    const href = chunkHref(citation);
    if (!href) return element("span", "citation-doc", text);
    const link = element("a", "citation-doc", text);
    link.href = href;
    link.target = "_blank";
    link.rel = "noopener";
    link.title = "Open the passage in its document";
    return link;
  }

  const where = (citation) => [citation.section, citation.location].filter(Boolean).join(" · ");
  const KIND_ORDER = { source: 0, entity: 1, relation: 2 };
  const byKind = (a, b) => (KIND_ORDER[a.kind] ?? 3) - (KIND_ORDER[b.kind] ?? 3);

  function citedItem(citation) {
    const item = element("li", `cited-item kind-${String(citation.kind || "").toLowerCase()}`);
    item.id = `cite-${citation.id}`;
    item.dataset.cite = citation.id;
    const head = element("div", "cited-head");
    head.append(element("span", "citation-id", citation.id));
    if (citation.kind === "source") {
      head.append(documentLink(citation, citation.document_title || "document"));
    } else {
      head.append(element("span", "citation-label", citation.label || citation.id));
      if (citation.document_title) head.append(documentLink(citation, citation.document_title));
    }
    if (where(citation)) head.append(element("span", "citation-where", where(citation)));
    item.append(head);
    const sentence = citation.sentence || citation.excerpt || "";
    if (sentence) item.append(element("blockquote", citation.sentence ? "citation-sentence" : "citation-excerpt", sentence));
    return item;
  }

  function retrievedRow(citation) {
    const row = element("tr", `kind-${String(citation.kind || "").toLowerCase()}`);
    row.id = `cite-${citation.id}`;
    row.dataset.cite = citation.id;
    const documentCell = element("td", "citation-document");
    documentCell.append(documentLink(citation, citation.document_title || ""));
    if (where(citation)) documentCell.append(element("span", "citation-where", where(citation)));
    const excerpt = element("td", "citation-excerpt");
    if (citation.kind !== "source" && citation.label) excerpt.append(element("strong", "", `${citation.label}: `));
    excerpt.append(element("span", "excerpt", citation.excerpt || ""));
    excerpt.title = citation.excerpt || "";
    row.append(element("td", "citation-id", citation.id), documentCell, excerpt);
    return row;
  }

  function renderCitations(sources, cited) {
    const citations = sources.citations || [];
    const byId = new Map(citations.map((citation) => [citation.id, citation]));
    const citedRows = cited
      .filter((id) => byId.has(id))
      .map((id) => byId.get(id))
      .sort(byKind);
    const citedSet = new Set(citedRows.map((citation) => citation.id));
    const rest = citations.filter((citation) => !citedSet.has(citation.id)).sort(byKind);
    $("cited").replaceChildren(...citedRows.map(citedItem));
    citationsBody.replaceChildren(...rest.map(retrievedRow));
    $("retrieved-count").textContent = String(rest.length);
    const retrieved = $("retrieved");
    retrieved.hidden = rest.length === 0;
    // Nothing cited (yet): what was retrieved is all there is to show.
    retrieved.open = citedRows.length === 0;
    $("citations-empty").hidden = citations.length > 0;
  }

  const citationsScroll = $("citations-scroll");
  citationsScroll.addEventListener("click", (event) => {
    const row = event.target.closest("tr, li");
    const link = row && row.querySelector("a[href]");
    if (link && !event.target.closest("a")) link.click();
  });
  citationsScroll.addEventListener("mouseover", (event) => {
    const row = event.target.closest("[data-cite]");
    if (row) highlightCitation(row.dataset.cite);
  });
  citationsScroll.addEventListener("mouseleave", () => highlightCitation(null));
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
  const READABLE_ZOOM = 0.85;
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
            "background-color": "data(colour)", label: "data(label)", "font-size": 12, color: "#1d2330",
            "text-valign": "bottom", "text-margin-y": 4, width: "data(size)", height: "data(size)",
            "text-wrap": "ellipsis", "text-max-width": 130, "text-outline-color": "#ffffff",
            "text-outline-width": 2, "border-width": 1, "border-color": "#ffffff",
          },
        },
        { selector: "edge", style: { width: "data(width)", "line-color": "#aab3c0", "curve-style": "bezier", opacity: 0.8 } },
        { selector: "node.cited", style: { "border-width": 3, "border-color": "#1d2330", "font-weight": "bold" } },
        { selector: "node.picked", style: { "border-width": 4, "border-color": "#111827" } },
        { selector: "node.hovered", style: { "border-width": 4, "border-color": "#111827", "z-index": 10, "font-size": 14 } },
        { selector: "edge.hovered", style: { "line-color": "#111827", opacity: 1 } },
        { selector: ".faded", style: { opacity: 0.2 } },
        { selector: "node.fresh", style: { "border-width": 2, "border-style": "dashed", "border-color": "#111827" } },
      ],
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

  function renderGraph(subgraph, citations, cited, { keepIfSame = false } = {}) {
    const key = JSON.stringify([(subgraph.nodes || []).length, (subgraph.edges || []).length, cited]);
    const sameAnswer = keepIfSame && drawn.subgraph === subgraph;
    if (sameAnswer && drawn.key === key) return;
    drawn = { subgraph, cited, showAll: sameAnswer ? drawn.showAll : false, key };
    citationById = new Map(citations.map((citation) => [citation.id, citation]));
    drawSubgraph();
  }

  function drawSubgraph() {
    const graph = ensureGraph();
    const { subgraph, cited, showAll } = drawn;
    const order = nodeOrder(subgraph, [...citationById.values()], cited);
    const limit = showAll ? Infinity : DEFAULT_NODES;
    const chosen = new Set([...order.keys()].slice(0, limit));
    const citedNodes = new Set([...order.entries()].filter(([, isCited]) => isCited).map(([id]) => id));
    graph.elements().remove();
    tooltip.hidden = true;
    addElements(
      (subgraph.nodes || []).filter((node) => chosen.has(String(node.id))),
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

  // fcose keeps labels apart (they count in the node sizes); long, slack edges between two
  // hubs and short, stiff ones around each hub pull the clusters apart. benchmarks/layout.py
  // measures it: clusters further apart than plain fcose, a little closer than cose, and no
  // overlapping labels where cose leaves about twenty.
  const bridge = (edge) => edge.source().degree() > 3 && edge.target().degree() > 3;
  function layout() {
    const nodes = cy.nodes().length;
    const options = nodes > 1
      ? {
        name: "fcose", quality: "proof", randomize: true, animate: false, fit: true, padding: 28,
        nodeDimensionsIncludeLabels: true, nodeSeparation: 90, packComponents: true, tile: true,
        idealEdgeLength: (edge) => (bridge(edge) ? 250 : 40),
        edgeElasticity: (edge) => (bridge(edge) ? 0.05 : 0.6),
        nodeRepulsion: 4500, gravity: 0.1,
      }
      : { name: "grid", fit: true, padding: 28 };
    cy.layout(options).run();
    readable();
  }

  // Fitting a big graph can shrink labels below reading size; keep them readable, centred on
  // what the answer cites, and let the reader pan (or enlarge the panel) for the rest.
  function readable() {
    if (cy.zoom() < READABLE_ZOOM) {
      const cited = cy.nodes(".cited");
      cy.zoom(READABLE_ZOOM);
      cy.center(cited.length ? cited : cy.nodes());
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
      readable();
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
    for (const row of citationsScroll.querySelectorAll("[data-cite]")) {
      const hit = ids.has(row.dataset.cite);
      row.classList.toggle(className, hit);
      if (hit && !first) first = row;
    }
    return { ids, first };
  }

  function clearRows(className) {
    for (const row of citationsScroll.querySelectorAll(`.${className}`)) row.classList.remove(className);
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
  explainMode();
  const lastAnswer = latestAnswer();
  if (lastAnswer && answers.has(lastAnswer.dataset.answer)) showSources(answers.get(lastAnswer.dataset.answer), lastAnswer);
  messages.scrollTop = messages.scrollHeight;
  connect();
})();
