// Rows of documents this page has not seen yet (uploaded elsewhere, or by a colleague) arrive
// as out-of-band swaps with no target; htmx reports those, and here they join the table.
document.body.addEventListener("htmx:oobErrorNoTarget", (event) => {
  const row = event.detail.content;
  const rows = document.getElementById("document-rows");
  if (!rows || !row || row.tagName !== "TR" || !row.id.startsWith("document-") || !row.children.length) return;
  rows.prepend(row);
  htmx.process(row);
  document.getElementById("no-documents")?.remove();
});
