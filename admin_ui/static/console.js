// integrationd console: keeps the overview live. Every sample interval it fetches
// /admin/overview/live (figures, SVG charts and tables, rendered on the server from one
// read model) and swaps it in whole, so no two figures on the page come from different
// moments. Vanilla JS, no build step, no external resources; the fragment is the
// console's own escaped markup, parsed inert in a <template>.
(function () {
  "use strict";

  function setText(id, value) {
    const node = document.getElementById(id);
    if (node) node.textContent = String(value);
  }

  function afterSwap() {
    const meta = document.getElementById("live-meta");
    if (!meta) return;
    const banner = document.getElementById("db-banner");
    if (banner) banner.hidden = meta.dataset.database === "ok";
    setText("live-status", "live \u00b7 " + meta.dataset.status);
  }

  function startOverview() {
    const box = document.getElementById("live");
    if (!box) return;
    const pollMs = Math.max(250, Number(document.body.dataset.pollMs) || 2000);
    afterSwap();
    async function tick() {
      try {
        const res = await fetch(box.dataset.src, {
          headers: { Accept: "text/html" }, credentials: "same-origin", cache: "no-store",
        });
        if (res.status === 401) { window.location.assign("/admin/sign-in?next=/admin/"); return; }
        if (res.ok) {
          const tpl = document.createElement("template");
          tpl.innerHTML = await res.text();
          box.replaceChildren(tpl.content);
          afterSwap();
        } else {
          setText("live-status", "update failed (HTTP " + res.status + "); retrying");
        }
      } catch (e) {
        setText("live-status", "console unreachable; retrying");
      }
      window.setTimeout(tick, pollMs);
    }
    window.setTimeout(tick, pollMs);
  }

  // History: the filter form names its range in a select (a preset, or custom for the
  // typed from/to). Typing a time chooses custom; choosing a preset empties the times.
  // Without script the select is chosen by hand; a preset with times is refused (400).
  function startHistoryForm() {
    const range = document.getElementById("h-range");
    if (!range) return;
    for (const id of ["h-from", "h-to"]) {
      const input = document.getElementById(id);
      input.addEventListener("input", function () {
        if (input.value.trim() !== "") range.value = "custom";
      });
    }
    range.addEventListener("change", function () {
      if (range.value === "custom") return;
      for (const id of ["h-from", "h-to"]) document.getElementById(id).value = "";
    });
  }

  if (document.body.dataset.page === "overview") startOverview();
  if (document.body.dataset.page === "history") startHistoryForm();
})();
