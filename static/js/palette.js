// One colour per entity type on every page. The colours are app.css's --type-<slot>; the slot
// rule is knowledge/web/palette.py's (the browser test checks that both give the same slots).
(function () {
  "use strict";

  const TYPE_SLOTS = {
    person: 0, organization: 1, location: 2, event: 3, product: 4, technology: 5, concept: 6, date: 7,
  };
  const SPARE_SLOTS = [8, 9, 10, 11];
  const OTHER_SLOT = 12;
  const UNTYPED = new Set(["", "other", "unknown"]);

  function normalize(type) {
    return String(type || "").trim().toLowerCase();
  }

  function slotOf(type) {
    const key = normalize(type);
    if (UNTYPED.has(key)) return OTHER_SLOT;
    if (key in TYPE_SLOTS) return TYPE_SLOTS[key];
    let code = 0;
    for (const char of key) code = (code * 31 + char.codePointAt(0)) % 4294967296;
    return SPARE_SLOTS[code % SPARE_SLOTS.length];
  }

  const colours = new Map();
  function colourOf(type) {
    const slot = slotOf(type);
    if (!colours.has(slot)) {
      const value = getComputedStyle(document.documentElement).getPropertyValue(`--type-${slot}`).trim();
      colours.set(slot, value || "#888888");
    }
    return colours.get(slot);
  }

  // A legend of types with their counts, most frequent first. With `onToggle`, each entry is a
  // toggle button (aria-pressed) that shows or hides its type.
  function renderLegend(list, counts, { onToggle = null, hidden = new Set() } = {}) {
    list.replaceChildren();
    const types = [...counts.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
    for (const [type, count] of types) {
      const item = document.createElement("li");
      const holder = onToggle ? document.createElement("button") : item;
      const dot = document.createElement("span");
      dot.className = `type-dot type-${slotOf(type)}`;
      const name = document.createElement("span");
      name.textContent = type || "untyped";
      const number = document.createElement("span");
      number.className = "legend-count";
      number.textContent = String(count);
      holder.append(dot, name, number);
      if (onToggle) {
        holder.type = "button";
        holder.className = "legend-toggle";
        holder.dataset.type = type;
        holder.setAttribute("aria-pressed", String(!hidden.has(type)));
        holder.title = `Show or hide ${type || "untyped"} entities`;
        holder.addEventListener("click", () => {
          const shown = holder.getAttribute("aria-pressed") !== "true";
          holder.setAttribute("aria-pressed", String(shown));
          onToggle(type, shown);
        });
        item.append(holder);
      }
      list.append(item);
    }
  }

  window.EntityPalette = { slotOf, colourOf, normalize, renderLegend };
})();
