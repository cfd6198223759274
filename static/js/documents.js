// The live document list. The workspace's events arrive as htmx out-of-band rows; a row the page
// does not show yet (uploaded elsewhere, or by a colleague) has no target, which htmx would
// report as an error. Such messages are handled here before htmx sees them: a new row joins the
// table when it fits the list's filter, a deletion of a row not shown is dropped.
(() => {
  "use strict";

  function list() {
    return document.getElementById("document-list");
  }

  function fitsFilter(row) {
    const shown = list();
    if (!shown || shown.dataset.firstPage !== "true") return false;
    const status = shown.dataset.status;
    const query = (shown.dataset.query || "").toLowerCase();
    if (status && row.dataset.status !== status) return false;
    return !query || (row.dataset.title || "").toLowerCase().includes(query);
  }

  document.body.addEventListener("htmx:wsBeforeMessage", (event) => {
    const holder = document.createElement("template");
    holder.innerHTML = event.detail.message;
    const elements = [...holder.content.children];
    if (elements.every((element) => element.id && document.getElementById(element.id))) return;
    event.preventDefault();
    for (const element of elements) {
      const present = element.id && document.getElementById(element.id);
      if (present) {
        if (element.getAttribute("hx-swap-oob") === "delete") present.remove();
        else {
          element.removeAttribute("hx-swap-oob");
          present.replaceWith(element);
          htmx.process(element);
        }
      } else if (element.tagName === "TR" && element.getAttribute("hx-swap-oob") !== "delete" && fitsFilter(element)) {
        element.removeAttribute("hx-swap-oob");
        document.getElementById("document-rows").prepend(element);
        htmx.process(element);
        document.getElementById("no-documents")?.remove();
      }
    }
  });
})();
