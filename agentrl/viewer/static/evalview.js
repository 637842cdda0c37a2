// agentrl view: the summary page (#/summary) of an `agentrl eval` directory: the report `agentrl eval` prints,
// the `--compare` results when that directory has them, and the pass@k plot. Blocks from /api/eval
// (agentrl/viewer/evalview.py): headings, tables, lists and paragraphs.
"use strict";

// inline `code` and **bold** of agentrl eval's Markdown, as elements (never as HTML)
function inline(text) {
  return text.split(/(`[^`]*`|\*\*[^*]*\*\*)/).filter(Boolean).map(part =>
    part.startsWith("`") ? h("code", {}, part.slice(1, -1))
      : part.startsWith("**") ? h("b", {}, part.slice(2, -2)) : part);
}

function block(b) {
  if (b.type === "heading") return h(`h${Math.min(6, b.level + 2)}`, {}, inline(b.text));
  if (b.type === "list") return h("ul", {}, b.items.map(i => h("li", {}, inline(i))));
  if (b.type === "paragraph") return h("p", {}, inline(b.text));
  return h("table", { class: "report" },
    h("tr", {}, b.header.map(c => h("th", {}, inline(c)))),
    b.rows.map(r => h("tr", {}, r.map((c, i) => h(i ? "td" : "th", { class: i ? "num" : "" }, inline(c))))));
}

// the blocks of one report: its title, then its tables side by side (the overall one and one per data source,
// each under its heading), then the rest (paired wins, warnings, settings) in order
function report(blocks) {
  const out = [], tables = h("div", { class: "report-tables" });
  for (let i = 0; i < blocks.length; i++) {
    const b = blocks[i], next = blocks[i + 1];
    if (b.type === "heading" && next && next.type === "table") {
      tables.append(h("div", { class: "report-table" },
        h("h4", {}, b.level === 1 ? "all tasks" : inline(b.text)), block(next)));
      if (b.level === 1) out.push(block(b), tables);
      i++;
    } else out.push(block(b));
  }
  if (!out.includes(tables)) out.unshift(tables);
  return out;
}

async function showEvalSummary() {
  const ev = await api("/api/eval");
  const parts = [];
  if (ev.compare)
    parts.push(h("div", { class: "panel", id: "eval-compare" }, report(ev.compare),
      h("div", { class: "muted" }, "from compare.md, written by agentrl eval --compare")));
  const own = h("div", { class: ev.compare ? "" : "panel", id: "eval-summary" }, report(ev.report));
  parts.push(ev.compare ? h("details", { class: "panel" }, h("summary", {}, `${ev.name} alone (eval.md)`), own)
                        : own);
  if (ev.pass_at_k)
    parts.push(h("div", { class: "panel" }, h("img", { src: "/api/eval/pass_at_k.png", alt: "pass@k curves",
                                                       class: "pass-at-k" })));
  app.replaceChildren(...parts);
}
