// Uploads with drag and drop (files and whole folders) and a progress bar per file. Each file
// goes in its own request, so each gets its own progress and its own outcome; the server answers
// JSON (see knowledge/web/views.py, upload). Without script the form still posts everything at once.
(() => {
  "use strict";

  const zone = document.getElementById("dropzone");
  const form = document.getElementById("upload-form");
  const queue = document.getElementById("upload-queue");
  const summary = document.getElementById("upload-summary");
  const fileInput = document.getElementById("file-input");
  const folderInput = document.getElementById("folder-input");
  const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  const AT_ONCE = 3;

  zone.hidden = false;
  // The drop zone replaces the plain file field; pasted text still goes through the form.
  document.getElementById("plain-files").hidden = true;

  const waiting = [];
  let running = 0;
  const tally = { success: 0, error: 0 };

  document.getElementById("pick-files").addEventListener("click", () => fileInput.click());
  document.getElementById("pick-folder").addEventListener("click", () => folderInput.click());
  for (const input of [fileInput, folderInput]) {
    input.addEventListener("change", () => {
      enqueue([...input.files].map((file) => ({ file, path: file.webkitRelativePath || file.name })));
      input.value = "";
    });
  }

  for (const name of ["dragenter", "dragover"]) {
    zone.addEventListener(name, (event) => {
      event.preventDefault();
      zone.classList.add("dragging");
    });
  }
  zone.addEventListener("dragleave", (event) => {
    if (!zone.contains(event.relatedTarget)) zone.classList.remove("dragging");
  });
  zone.addEventListener("drop", async (event) => {
    event.preventDefault();
    zone.classList.remove("dragging");
    enqueue(await droppedFiles(event.dataTransfer));
  });

  // Dropped folders come as directory entries: walk them for their files and paths.
  async function droppedFiles(transfer) {
    const entries = [...transfer.items].map((item) => item.webkitGetAsEntry && item.webkitGetAsEntry());
    if (!entries.length || entries.some((entry) => !entry)) {
      return [...transfer.files].map((file) => ({ file, path: file.name }));
    }
    const found = [];
    for (const entry of entries) await walk(entry, found);
    return found;
  }

  async function walk(entry, found) {
    if (entry.isFile) {
      const file = await new Promise((resolve, reject) => entry.file(resolve, reject));
      found.push({ file, path: entry.fullPath.replace(/^\//, "") });
      return;
    }
    const reader = entry.createReader();
    // readEntries hands out a directory in batches; an empty batch is the end.
    for (;;) {
      const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
      if (!batch.length) break;
      for (const child of batch) await walk(child, found);
    }
  }

  function enqueue(items) {
    for (const item of items) {
      item.row = row(item.path);
      queue.append(item.row.element);
      waiting.push(item);
    }
    report();
    pump();
  }

  function row(path) {
    const element = document.createElement("li");
    const name = document.createElement("span");
    name.className = "file-name";
    name.textContent = path;
    name.title = path;
    const bar = document.createElement("progress");
    bar.max = 100;
    bar.value = 0;
    bar.setAttribute("aria-label", `Uploading ${path}`);
    const outcome = document.createElement("span");
    outcome.className = "outcome";
    outcome.textContent = "Waiting…";
    element.append(name, bar, outcome);
    return { element, bar, outcome };
  }

  function pump() {
    while (running < AT_ONCE && waiting.length) {
      running += 1;
      send(waiting.shift()).finally(() => {
        running -= 1;
        report();
        pump();
      });
    }
  }

  function send({ file, path, row: { element, bar, outcome } }) {
    return new Promise((resolve) => {
      const body = new FormData();
      body.append("csrfmiddlewaretoken", csrf);
      body.append("files", file);
      body.append("path", path);
      // The name as the browser has it: the server's multipart parser cuts a name at a slash.
      body.append("name", file.name);
      body.append("tags", document.getElementById("id_tags")?.value || "");
      const request = new XMLHttpRequest();
      request.open("POST", zone.dataset.uploadUrl);
      request.setRequestHeader("Accept", "application/json");
      request.setRequestHeader("X-CSRFToken", csrf);
      request.upload.addEventListener("progress", (event) => {
        if (event.lengthComputable) bar.value = Math.round((100 * event.loaded) / event.total);
        outcome.textContent = "Uploading…";
      });
      request.addEventListener("load", () => {
        let answer = {};
        try {
          answer = JSON.parse(request.responseText);
        } catch (error) {
          answer = { error: `The server answered HTTP ${request.status}.` };
        }
        const [result] = answer.results || [{ level: "error", message: answer.error || `HTTP ${request.status}` }];
        finish(element, bar, outcome, result);
        resolve();
      });
      request.addEventListener("error", () => {
        finish(element, bar, outcome, { level: "error", message: `${path}: the upload failed (connection lost).` });
        resolve();
      });
      request.send(body);
    });
  }

  function finish(element, bar, outcome, result) {
    bar.value = 100;
    element.classList.add(result.level);
    tally[result.level === "success" ? "success" : "error"] += 1;
    outcome.replaceChildren(document.createTextNode(result.message));
    if (result.document) {
      const link = document.createElement("a");
      link.href = result.document.url;
      link.textContent = "Open";
      outcome.append(" ", link);
    }
  }

  function report() {
    const pending = waiting.length + running;
    const parts = [];
    if (tally.success) parts.push(`${tally.success} queued for ingestion`);
    if (tally.error) parts.push(`${tally.error} refused`);
    if (pending) parts.push(`${pending} uploading`);
    summary.replaceChildren(document.createTextNode(parts.length ? `${parts.join(", ")}.` : ""));
    if (!pending && tally.success) {
      const link = document.createElement("a");
      link.href = zone.dataset.documentsUrl;
      link.textContent = "Follow their progress in the document list";
      summary.append(" ", link, ".");
    }
  }
})();
