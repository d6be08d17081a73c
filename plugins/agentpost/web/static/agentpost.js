/* agentpost page helpers: times in the viewer's zone, live refresh of JSON into the page, and
   charts with uPlot. No framework and no build step; every page works without JavaScript,
   only less live (and with times in UTC). */
"use strict";
const agentpost = (() => {
  const root = document.body.dataset.root || "";
  const charts = {};

  /* -- times ------------------------------------------------------------------------------ */

  const pad = (n, w = 2) => String(n).padStart(w, "0");

  function zoneName(d) {
    try {
      const part = new Intl.DateTimeFormat(undefined, {timeZoneName: "short"})
        .formatToParts(d).find((p) => p.type === "timeZoneName");
      return part ? part.value : "";
    } catch (e) {
      return "";
    }
  }

  /* "2026-11-27 10:39:12 CET" in the viewer's zone (milliseconds when `ms`). */
  function localText(d, ms) {
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) +
      (ms ? "." + pad(d.getMilliseconds(), 3) : "") + " " + zoneName(d);
  }

  /* Every <time datetime> under `scope` (the server wrote UTC text and a UTC title) now reads
     in the viewer's zone; the title keeps UTC. */
  function localise(scope = document) {
    for (const el of scope.querySelectorAll("time[datetime]")) {
      const d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) continue;
      el.textContent = localText(d, el.dataset.ms === "1");
      el.dataset.local = "1";
    }
  }

  /* A <time> element for an ISO time from the JSON API (the live refresh's cells). */
  function timeElement(iso, ms = false) {
    const el = document.createElement("time");
    const d = new Date(iso);
    if (!iso || isNaN(d)) {
      el.textContent = "–";
      return el;
    }
    el.setAttribute("datetime", d.toISOString());
    el.title = d.toISOString().replace("T", " ").replace("Z", " UTC");
    if (ms) el.dataset.ms = "1";
    el.textContent = localText(d, ms);
    el.dataset.local = "1";
    return el;
  }

  /* -- live refresh ----------------------------------------------------------------------- */

  /* Fetch `path` (relative to the app) as JSON every `seconds`, passing it to `apply`.
     Stops retrying quickly on 401/403 (signed out); shows the last error in #live-status. */
  function poll(path, seconds, apply) {
    const status = document.getElementById("live-status");
    async function tick() {
      try {
        const r = await fetch(root + path, {headers: {"Accept": "application/json"},
                                            credentials: "same-origin"});
        if (r.status === 401 || r.status === 403) {
          if (status) status.textContent = "signed out: reload the page";
          return;
        }
        const body = await r.json();
        if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
        apply(body);
        if (status) status.textContent = "live · updated " + localText(new Date(), false);
      } catch (e) {
        if (status) status.textContent = "refresh failed: " + e.message;
      }
      setTimeout(tick, seconds * 1000);
    }
    setTimeout(tick, seconds * 1000);
  }

  /* -- charts ----------------------------------------------------------------------------- */

  const COLOURS = ["#0b6bcb", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#0a7e8c",
                   "#bc4c00", "#6e7781", "#bf3989", "#4d7c0f"];

  /* A uPlot chart in `el` from columns [xs, ys...]; `series` names the ys. Options:
     - x is unix seconds on a time axis (in the viewer's zone), unless `time: false`;
     - `categories`: labels of x = 0, 1, 2...: a bar chart with one bar per category, the
       labels on the x axis (histogram buckets, outcomes);
     - `bars`, `points`; `xlabel`, `ylabel`; `yrange: [min, max]` (else from 0 for bars);
     - `xpad`: seconds of margin around a time axis (a single point gets a readable span);
     - `colourOf(i)` / `dashOf(i)`: a series' colour index and dash (e.g. p50 dashed).
     The chart is kept in agentpost.charts[el.id]; el.dataset.xaxis says which x axis. */
  function chart(el, title, data, series, opts = {}) {
    if (typeof uPlot === "undefined" || !el) return null;
    const categories = opts.categories || null;
    const bars = !!(opts.bars || categories);
    const s = [{}].concat(series.map((name, i) => {
      const colour = COLOURS[(opts.colourOf ? opts.colourOf(i) : i) % COLOURS.length];
      return {
        label: name, stroke: colour, width: 2, dash: opts.dashOf ? opts.dashOf(i) : undefined,
        fill: bars ? colour + "55" : undefined,
        paths: bars && uPlot.paths.bars ? uPlot.paths.bars({size: [0.7, 80]}) : undefined,
        points: {show: !!opts.points},
      };
    }));
    const width = Math.max(320, Math.min(el.clientWidth || 640, 900));
    const time = !categories && opts.time !== false;
    const u = new uPlot({
      title, width, height: opts.height || 240, series: s,
      padding: [12, categories && opts.rotate ? 44 : 16, 0, 0],
      scales: {x: xScale(categories, time, opts), y: yScale(bars, opts)},
      axes: [xAxis(categories, opts), yAxis(bars, opts)],
      legend: {live: !categories},
    }, data, el);
    el.dataset.xaxis = categories ? "category" : (time ? "time" : "number");
    if (el.id) charts[el.id] = u;
    return u;
  }

  function xScale(categories, time, opts) {
    if (categories) return {time: false, range: () => [-0.5, categories.length - 0.5]};
    if (!time) return {time: false};
    const margin = opts.xpad || 0;
    /* From the data itself: for a single point uPlot proposes [x, x + 86400000] (a day in
       milliseconds added to seconds), which put one analytics window at the edge of years. */
    return {time: true, range: (u, min, max) => {
      const xs = (u.data && u.data[0]) || [];
      if (!xs.length) return [min == null ? 0 : min, max == null ? 1 : max];
      const lo = xs[0], hi = xs[xs.length - 1], span = hi - lo;
      const m = Math.max(margin, span * 0.03, span === 0 ? 1800 : 0);
      return [lo - m, hi + m];
    }};
  }

  function yScale(bars, opts) {
    if (opts.yrange) return {range: () => opts.yrange};
    if (!bars) return {};
    return {range: (u, min, max) => [0, Math.max(1, max * 1.1)]};
  }

  /* Bars count things: whole-number ticks only. */
  const COUNT_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5,
                       2e5, 5e5, 1e6, 1e7, 1e8, 1e9];

  function yAxis(bars, opts) {
    const axis = {label: opts.ylabel || "", size: 56};
    if (bars) axis.incrs = COUNT_STEPS;
    return axis;
  }

  function xAxis(categories, opts) {
    const axis = {label: opts.xlabel || ""};
    if (categories) {
      axis.splits = () => categories.map((_, i) => i);
      axis.values = () => categories;
      axis.gap = 6;
      if (opts.rotate) {
        axis.rotate = opts.rotate;
        axis.size = 64;
      }
    }
    return axis;
  }

  function text(id, value) {
    const el = document.getElementById(id);
    if (el) el.textContent = value;
  }

  localise();
  return {root, poll, chart, charts, text, localise, timeElement};
})();
