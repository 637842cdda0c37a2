// agentrl view: the curves page (#/curves) of a training run. The panels, their units and the held-out labels
// come from /api/curves (agentrl/viewer/curves.py, the list curves.png uses); the rows from /api/metrics.
// Each series: a faint raw line, its trailing moving average on top; held-out (val/) values as marks.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLOURS = ["#2f6fdb", "#d1495b", "#8a5cc2"];
let metricRows = [];
let curvePanels = null;

// the trailing mean of agentrl.trainer.curve_panels.moving_average, over the last `window` values
function movingAverage(values, window) {
  const out = [];
  let total = 0;
  values.forEach((v, i) => {
    total += v;
    if (i >= window) total -= values[i - window];
    out.push(total / Math.min(i + 1, window));
  });
  return out;
}

// a round step (1, 2 or 5 times a power of ten) that cuts `range` into about `count` pieces
function niceStep(range, count) {
  const raw = range / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

// {lo, hi, step, ticks}: an axis on round values that covers [lo, hi]; a flat series gets a readable span
function niceAxis(lo, hi, count, { integer = false } = {}) {
  if (!(hi - lo > 1e-12 * Math.max(1, Math.abs(hi)))) {
    const pad = integer ? 1 : (lo === 0 ? 1 : Math.abs(lo) / 2);
    [lo, hi] = lo === 0 && !integer ? [0, 1] : [lo - pad, hi + pad];
  }
  let step = niceStep(hi - lo, count);
  if (integer) step = Math.max(1, Math.round(step));
  const start = Math.floor(lo / step + 1e-9) * step, end = Math.ceil(hi / step - 1e-9) * step;
  const ticks = [];
  for (let k = 0; start + k * step <= end + step * 1e-6; k++) ticks.push(start + k * step);
  return { lo: start, hi: end, step, ticks };
}

// a tick label of `axis`: as many decimals as its step needs; thousands as 12k on an axis that reaches 10,000;
// 1.5e-6 on an axis whose step is below 1e-4
function tickLabel(v, axis) {
  const step = axis.step;
  if (Math.abs(v) < step * 1e-6) return "0";
  if (step >= 1000 && Math.max(...axis.ticks.map(Math.abs)) >= 10000) return `${v / 1000}k`;  // whole thousands
  const decimals = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9));
  if (decimals > 4) {
    const digits = Math.floor(Math.log10(Math.abs(v))) - Math.floor(Math.log10(step));  // what tells ticks apart
    return v.toExponential(Math.max(0, digits));
  }
  return v.toFixed(decimals);
}

function valueLabel(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1000) return v.toFixed(0);
  if (a >= 1e-3) return String(+v.toPrecision(3));
  return v.toExponential(2);
}

function svgEl(parent, tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  parent.append(el);
  return el;
}

function points(key) {
  return metricRows.filter(r => typeof r[key] === "number" && Number.isFinite(r[key])).map(r => [r.step, r[key]]);
}

function chart(panel, window) {
  const series = panel.series.map((s, i) => ({ ...s, colour: COLOURS[i % COLOURS.length], pts: points(s.key) }))
    .filter(s => s.pts.length);
  const heldOut = points(panel.held_out.key);
  if (!series.length) return null;
  const box = h("div", { class: "chart", "data-key": panel.key }, h("h4", {}, panel.title,
    h("span", { class: "muted" }, ` · ${panel.key}`)));
  const all = series.flatMap(s => s.pts).concat(heldOut);
  const W = 440, H = 230, L = 56, R = 12, T = 10, B = 38;
  const xa = niceAxis(Math.min(...all.map(p => p[0])), Math.max(...all.map(p => p[0])), 6, { integer: true });
  const ya = niceAxis(Math.min(...all.map(p => p[1])), Math.max(...all.map(p => p[1])), 5);
  const sx = x => L + (x - xa.lo) / (xa.hi - xa.lo) * (W - L - R);
  const sy = y => T + (1 - (y - ya.lo) / (ya.hi - ya.lo)) * (H - T - B);
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  for (const t of ya.ticks) {
    svgEl(svg, "line", { class: "grid", x1: L, x2: W - R, y1: sy(t), y2: sy(t) });
    svgEl(svg, "text", { class: "tick y", x: L - 5, y: sy(t) + 3.5, "text-anchor": "end" }, tickLabel(t, ya));
  }
  for (const t of xa.ticks) {
    svgEl(svg, "line", { class: "grid", x1: sx(t), x2: sx(t), y1: T, y2: H - B });
    svgEl(svg, "text", { class: "tick x", x: sx(t), y: H - B + 14, "text-anchor": "middle" }, tickLabel(t, xa));
  }
  svgEl(svg, "line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B });
  svgEl(svg, "line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B });
  svgEl(svg, "text", { class: "axis-label", x: (L + W - R) / 2, y: H - 5, "text-anchor": "middle" }, panel.x_label);
  svgEl(svg, "text", { class: "axis-label", x: 0, y: 0, "text-anchor": "middle",
                       transform: `translate(12 ${(T + H - B) / 2}) rotate(-90)` }, panel.unit);
  const line = pts => pts.map(p => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
  for (const s of series) {
    svgEl(svg, "polyline", { class: "raw", stroke: s.colour, points: line(s.pts), "data-key": s.key });
    const smooth = movingAverage(s.pts.map(p => p[1]), window);
    svgEl(svg, "polyline", { class: "smooth", stroke: s.colour, "data-key": s.key,
                             points: line(s.pts.map((p, i) => [p[0], smooth[i]])) });
  }
  if (heldOut.length) {
    const g = svgEl(svg, "g", { class: "held-out", "data-key": panel.held_out.key });
    if (heldOut.length > 1) svgEl(g, "polyline", { points: line(heldOut) });
    for (const [x, y] of heldOut) {
      const d = 5;
      svgEl(g, "path", { d: `M${sx(x)},${sy(y) - d}l${d},${d}l${-d},${d}l${-d},${-d}z` },);
    }
  }
  box.append(svg, legend(series, heldOut, panel.held_out.label, window));
  return box;
}

function legend(series, heldOut, heldOutLabel, window) {
  const items = series.map(s => {
    const last = s.pts.slice(-window).map(p => p[1]);
    const mean = last.reduce((a, b) => a + b, 0) / last.length;
    return h("div", {}, h("span", { class: "swatch", style: `background:${s.colour}` }), `${s.label}: `,
      h("b", {}, valueLabel(mean)));
  });
  if (heldOut.length) {
    const [step, value] = heldOut.at(-1);
    items.push(h("div", { class: "held-out-legend" }, h("span", { class: "diamond" }, "◆"),
      `${heldOutLabel}: `, h("b", {}, valueLabel(value)), h("span", { class: "muted" }, ` (step ${step})`)));
  }
  return h("div", { class: "legend-lines" }, items);
}

function curvesStatus(data) {
  if (data.complete) return " · run complete";
  if (data.age_s !== null && data.age_s > 600)
    return ` · no COMPLETE file and no new row for ${Math.round(data.age_s / 60)} min (stopped?) · `
      + "refreshing every 5 s";
  return " · live: refreshing every 5 s";
}

async function showCurves() {
  if (curvePanels === null) curvePanels = await api("/api/curves");
  const data = await api(`/api/metrics?since=${metricRows.length}`);
  if (data.total < metricRows.length) metricRows = [];
  metricRows = metricRows.concat(data.rows);
  const charts = curvePanels.panels.map(p => chart(p, curvePanels.window));
  const missing = curvePanels.panels.filter((p, i) => charts[i] === null).map(p => `${p.title} (${p.key})`);
  const steps = metricRows.map(r => r.step);
  app.replaceChildren(
    h("div", { class: "summary", id: "curves-status" },
      metricRows.length ? `steps ${Math.min(...steps)}–${Math.max(...steps)} logged` : "", curvesStatus(data)),
    h("div", { class: "muted", id: "curves-key" }, `thick line: trailing ${curvePanels.window}-step mean (the `,
      `value in each legend is the latest one); faint line: the raw value of every step; `,
      h("span", { class: "diamond" }, "◆"), " held-out (validation) values, where the run logs them"),
    metricRows.length ? h("div", { class: "charts", id: "charts" }, charts)
                      : h("div", { class: "muted" }, "no metrics.jsonl rows yet"),
    metricRows.length && missing.length
      ? h("div", { class: "muted", id: "curves-missing" }, `not logged by this run: ${missing.join(", ")}`) : null);
  if (!data.complete) schedule(render, 5000);
}
