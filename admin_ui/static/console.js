// integrationd console: live overview (polls /admin/api/overview for the figures and
// tables, /admin/overview/charts for the server-drawn SVG charts).
// Vanilla JS, no build step, no external resources; data is inserted with textContent only.
(function () {
  "use strict";

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "\u2014";
    if (seconds < 90) return Math.round(seconds) + " s";
    if (seconds < 5400) return Math.round(seconds / 60) + " min";
    if (seconds < 129600) return (seconds / 3600).toFixed(1) + " h";
    return (seconds / 86400).toFixed(1) + " d";
  }

  function badge(text, extra) {
    return el("span", { class: "state state-" + text + (extra ? " " + extra : "") }, text);
  }

  function setText(id, value) {
    const node = document.getElementById(id);
    if (node) node.textContent = String(value);
  }

  function fillTable(id, rows, emptyText, columns) {
    const table = document.getElementById(id);
    if (!table) return;
    const body = table.tBodies[0];
    const fresh = document.createElement("tbody");
    if (!rows.length) {
      const tr = el("tr", { class: "empty-row" });
      tr.appendChild(el("td", { colspan: columns, class: "empty" }, emptyText));
      fresh.appendChild(tr);
    }
    for (const row of rows) fresh.appendChild(row);
    table.replaceChild(fresh, body);
  }

  function cell(content, cls) {
    const td = el("td", cls ? { class: cls } : {});
    if (content instanceof Node) td.appendChild(content);
    else td.textContent = String(content);
    return td;
  }

  // ------------------------------------------------------------- charts
  // The server draws the charts (SVG, admin_ui/charts.py); each poll swaps in the fresh
  // fragment. It is the console's own escaped markup, parsed inert in a <template>.

  async function refreshCharts() {
    const box = document.getElementById("charts");
    if (!box) return;
    const res = await fetch(box.dataset.src, {
      headers: { Accept: "text/html" }, credentials: "same-origin", cache: "no-store",
    });
    if (!res.ok) return;
    const tpl = document.createElement("template");
    tpl.innerHTML = await res.text();
    box.replaceChildren(tpl.content);
  }

  // ----------------------------------------------------------- overview

  let previous = null;

  function renderOverview(doc) {
    const banner = document.getElementById("db-banner");
    if (banner) banner.hidden = doc.database === "ok";
    const pressure = doc.pressure || [];
    const dead = pressure.filter((r) => r.state === "dead").reduce((a, r) => a + r.depth, 0);
    const open = pressure.filter((r) => r.state !== "dead").reduce((a, r) => a + r.depth, 0);
    setText("open-depth", open);
    const dlq = document.querySelector("#dlq-depth a");
    if (dlq) dlq.textContent = String(dead);
    setText("throughput-rate", doc.throughput.per_s);
    setText("throughput-window", age(doc.throughput.window_s));
    setText("finished-count", doc.throughput.finished);
    setText("receipt-rate", doc.flow.receipts_per_s);
    const p99 = doc.flow.latency.receipt_p99_ms;
    setText("receipt-p99", p99 === null ? "\u2014" : p99 + " ms");
    setText("lease-lost", Math.round(doc.local.totals.lease_lost));
    if (previous && doc.now_us > previous.now_us) {
      const dt = (doc.now_us - previous.now_us) / 1e6;
      const rate = (doc.local.totals.claimed - previous.local.totals.claimed) / dt;
      setText("claim-rate", Math.max(0, rate).toFixed(1));
    }
    const sampleAge = doc.sample.age_s === null ? "no sample yet" : "last sample " + age(doc.sample.age_s) + " ago";
    setText("live-status", "live \u00b7 sampled every " + doc.sample.interval_s + " s; " + sampleAge);

    fillTable("pressure", pressure.map((r) => {
      const tr = el("tr", { "data-family": r.family, "data-state": r.state });
      tr.append(cell(r.family), cell(badge(r.state)), cell(r.depth, "num depth"),
        cell(age(r.oldest_age_s), "num age"));
      return tr;
    }), doc.sample.at_us === null ? "No depth sample yet." : "No open or dead work.", 4);

    fillTable("outcomes", doc.throughput.by_outcome.map((r) => {
      const tr = el("tr", { "data-family": r.family, "data-outcome": r.outcome });
      tr.append(cell(r.family), cell(badge(r.outcome)), cell(r.count, "num"), cell(r.per_s, "num"));
      return tr;
    }), "Nothing finished in this window.", 4);

    const local = doc.local;
    fillTable("local", Object.keys(local.claimed).map((family) => {
      const tr = el("tr", { "data-family": family });
      tr.append(cell(family), cell(Math.round(local.claimed[family]), "num"),
        cell(Math.round(local.claim_contention[family] || 0), "num"),
        cell(Math.round(local.lease_lost[family] || 0), "num"),
        cell(Math.round(local.in_flight[family] || 0), "num"));
      return tr;
    }), "This replica has claimed nothing yet.", 5);

    if (doc.replicas === null) {
      fillTable("replicas", [], "Unknown: the database is unreachable.", 4);
    } else {
      fillTable("replicas", doc.replicas.map((r) => {
        const tr = el("tr", { "data-replica": r.replica_id });
        const state = el("span", {});
        state.appendChild(badge(r.state));
        if (r.stale) { state.appendChild(document.createTextNode(" ")); state.appendChild(badge("stale")); }
        tr.append(cell(el("code", {}, r.replica_id)), cell(state),
          cell(age(r.heartbeat_age_s) + " ago"), cell(r.version));
        return tr;
      }), "No replica has reported yet.", 4);
    }
    previous = doc;
  }

  function startOverview() {
    const pollMs = Math.max(250, Number(document.body.dataset.pollMs) || 2000);
    async function tick() {
      try {
        const res = await fetch("/admin/api/overview", {
          headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store",
        });
        if (res.status === 401) { window.location.assign("/admin/sign-in?next=/admin/"); return; }
        if (res.ok) { renderOverview(await res.json()); await refreshCharts(); }
        else setText("live-status", "update failed (HTTP " + res.status + "); retrying");
      } catch (e) {
        setText("live-status", "console unreachable; retrying");
      }
      window.setTimeout(tick, pollMs);
    }
    window.setTimeout(tick, pollMs);
  }

  if (document.body.dataset.page === "overview") startOverview();
})();
