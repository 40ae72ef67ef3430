// integrationd console: live overview (polls /admin/api/overview) and inline SVG charts.
// Vanilla JS, no build step, no external resources; data is inserted with textContent only.
(function () {
  "use strict";

  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f5bd3", "#c0362c", "#1f8a4c", "#b26b00", "#7b3fc4", "#0e8a8a", "#666"];
  const STATE_ORDER = ["pending", "retry", "processing", "dead", "awaiting_legacy_outcome",
    "legacy_outcome_unknown"];

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function svgEl(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
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

  function drawChart(svg, legend, seriesList, unit) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    if (legend) while (legend.firstChild) legend.removeChild(legend.firstChild);
    const W = 640, H = 180, L = 48, R = 8, T = 10, B = 22;
    const xs = seriesList.length ? seriesList[0].points.map((p) => p[0]) : [];
    let maxY = 0;
    for (const s of seriesList) for (const p of s.points) maxY = Math.max(maxY, p[1]);
    maxY = maxY <= 0 ? 1 : maxY * 1.1;
    svg.appendChild(svgEl("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
    svg.appendChild(svgEl("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
    const top = svgEl("text", { class: "tick", x: L - 6, y: T + 8, "text-anchor": "end" });
    top.textContent = maxY >= 10 ? Math.round(maxY) : maxY.toFixed(2);
    svg.appendChild(top);
    const zero = svgEl("text", { class: "tick", x: L - 6, y: H - B, "text-anchor": "end" });
    zero.textContent = "0";
    svg.appendChild(zero);
    if (xs.length < 1) {
      const none = svgEl("text", { class: "tick", x: W / 2, y: H / 2, "text-anchor": "middle" });
      none.textContent = "waiting for samples\u2026";
      svg.appendChild(none);
      return;
    }
    const x0 = xs[0], x1 = xs[xs.length - 1];
    const span = Math.max(1, x1 - x0);
    const sx = (x) => L + ((x - x0) / span) * (W - L - R);
    const sy = (y) => H - B - (y / maxY) * (H - B - T);
    const label = svgEl("text", { class: "tick", x: W - R, y: H - 6, "text-anchor": "end" });
    label.textContent = "last " + age(span / 1e6) + (unit ? " \u00b7 " + unit : "");
    svg.appendChild(label);
    seriesList.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      const pts = s.points.map((p) => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1));
      if (pts.length === 1) pts.push((W - R) + "," + sy(s.points[0][1]).toFixed(1));
      const line = svgEl("polyline", { class: "line", points: pts.join(" "), stroke: color,
        "data-series": s.name });
      svg.appendChild(line);
      if (legend) {
        const item = el("span", {});
        const sw = el("span", { class: "swatch" });
        sw.style.background = color;
        item.appendChild(sw);
        item.appendChild(document.createTextNode(s.name + " " + s.last));
        legend.appendChild(item);
      }
    });
  }

  function drawCharts(doc) {
    const series = doc.series || [];
    const states = new Set();
    for (const p of series) for (const k of Object.keys(p.depth)) states.add(k);
    const ordered = STATE_ORDER.filter((s) => states.has(s))
      .concat([...states].filter((s) => !STATE_ORDER.includes(s)).sort());
    const depthSeries = ordered.map((state) => {
      const points = series.map((p) => [p.at_us, p.depth[state] || 0]);
      return { name: state, points, last: points.length ? points[points.length - 1][1] : 0 };
    });
    if (!depthSeries.length && series.length) {
      depthSeries.push({ name: "all states", points: series.map((p) => [p.at_us, 0]), last: 0 });
    }
    const depthSvg = document.getElementById("chart-depth");
    if (depthSvg) drawChart(depthSvg, document.getElementById("legend-depth"), depthSeries, "items");
    const tp = series.map((p) => [p.at_us, p.finished_per_s]);
    const tpSvg = document.getElementById("chart-throughput");
    if (tpSvg) {
      drawChart(tpSvg, document.getElementById("legend-throughput"),
        [{ name: "finished/s", points: tp, last: tp.length ? tp[tp.length - 1][1] : 0 }], "per s");
    }
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
    setText("finished-count", doc.throughput.finished);
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
    drawCharts(doc);
    previous = doc;
  }

  function startOverview() {
    const pollMs = Math.max(250, Number(document.body.dataset.pollMs) || 2000);
    const initial = document.getElementById("overview-data");
    if (initial) {
      try { const doc = JSON.parse(initial.textContent); drawCharts(doc); previous = doc; }
      catch (e) { /* the next poll redraws */ }
    }
    async function tick() {
      try {
        const res = await fetch("/admin/api/overview", {
          headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store",
        });
        if (res.status === 401) { window.location.assign("/admin/sign-in?next=/admin/"); return; }
        if (res.ok) renderOverview(await res.json());
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
