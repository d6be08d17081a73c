/* agentpost page helpers: live refresh of JSON into the page, and charts with uPlot.
   No framework and no build step; every page works without JavaScript, only less live. */
"use strict";
const agentpost = (() => {
  const root = document.body.dataset.root || "";

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
        if (status) status.textContent = "live · updated " + new Date().toLocaleTimeString();
      } catch (e) {
        if (status) status.textContent = "refresh failed: " + e.message;
      }
      setTimeout(tick, seconds * 1000);
    }
    setTimeout(tick, seconds * 1000);
  }

  /* A uPlot chart in `el` from columns [xs, ys...]; `series` names the ys.
     `opts.bars` draws bars; x is unix seconds unless `opts.time === false`;
     `opts.xticks` names the x positions 0, 1, 2... (categories such as histogram buckets). */
  function chart(el, title, data, series, opts = {}) {
    if (typeof uPlot === "undefined" || !el) return null;
    const colours = ["#0b6bcb", "#cf222e", "#1a7f37", "#9a6700", "#8250df"];
    const s = [{}].concat(series.map((name, i) => ({
      label: name, stroke: colours[i % colours.length], width: 2,
      fill: opts.bars ? colours[i % colours.length] + "55" : undefined,
      paths: opts.bars && uPlot.paths.bars ? uPlot.paths.bars({size: [0.8, 60]}) : undefined,
      points: {show: !!opts.points},
    })));
    const width = Math.max(320, Math.min(el.clientWidth || 640, 900));
    return new uPlot({title, width, height: opts.height || 220, series: s,
                      scales: {x: {time: opts.time !== false}},
                      axes: [xAxis(opts), {label: opts.ylabel || ""}]},
                     data, el);
  }

  function xAxis(opts) {
    const axis = {label: opts.xlabel || ""};
    if (opts.xticks) {
      axis.splits = () => opts.xticks.map((_, i) => i);
      axis.values = () => opts.xticks;
      axis.rotate = -30;
      axis.size = 60;
    }
    return axis;
  }

  function text(id, value) {
    const el = document.getElementById(id);
    if (el) el.textContent = value;
  }

  return {root, poll, chart, text};
})();
