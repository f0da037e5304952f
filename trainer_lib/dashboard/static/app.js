// posttrain dashboard: the views over the read-only JSON API (trainer_lib/dashboard/web.py).
// Everything a run wrote (names, configs, prompts, completions) is untrusted: it reaches the page only
// as text nodes (el() below), never as HTML.
"use strict";

const POLL_MS = 2000;
let timer = null;

// ---------------------------------------------------------------- small helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "onclick" || key === "onchange" || key === "oninput") node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fill(node, ...children) {
  // replaceChildren, leaving out the sections a view does not have (null)
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

async function api(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function fmt(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return String(value);
    return Math.abs(value) >= 1e4 || (Math.abs(value) < 1e-3 && value !== 0) ? value.toExponential(3) : value.toPrecision(4);
  }
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) : "";
}

function statusBadge(status) {
  return el("span", { class: `status status-${status}`, "data-status": status }, status);
}

function runLink(id, text) {
  return el("a", { href: `#/run/${encodeURIComponent(id)}` }, text || id);
}

function table(headers, rows, attrs) {
  return el("table", attrs || {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function problemsBox(problems) {
  if (!problems || !problems.length) return null;
  return el("div", { class: "problems", "data-problems": "" }, el("strong", {}, "Could not read everything:"),
    el("ul", {}, problems.map((p) => el("li", {}, p))));
}

// ---------------------------------------------------------------- curves

// the keys drawn first, in this order; the rest follow alphabetically
const PREFERRED = ["loss", "eval_loss", "reward", "reward_std", "kl", "entropy", "clip_fraction",
  "response_length", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracy",
  "lr", "grad_norm", "tokens_per_s", "samples_per_s", "generate_time", "train_time"];
const NOT_DRAWN = new Set(["step", "time", "split", "epoch", "tokens"]);

function smooth(values, weight) {
  // TensorBoard's exponential moving average, debiased
  if (!weight) return values;
  let last = 0, count = 0;
  return values.map((v) => {
    if (v === null || !Number.isFinite(v)) return v;
    count += 1;
    last = last * weight + (1 - weight) * v;
    return last / (1 - Math.pow(weight, count));
  });
}

function metricKeys(records) {
  const keys = new Set();
  for (const record of records) {
    for (const [key, value] of Object.entries(record)) {
      if (!NOT_DRAWN.has(key) && typeof value === "number") keys.add(key);
    }
  }
  const rest = [...keys].filter((k) => !PREFERRED.includes(k)).sort();
  return PREFERRED.filter((k) => keys.has(k)).concat(rest);
}

function xValues(records, axis) {
  // step, or tokens seen: the running sum of each train record's window tokens
  if (axis !== "tokens") return records.map((r) => r.step);
  let seen = 0;
  return records.map((r) => {
    if (r.split === "train" && typeof r.tokens === "number") seen += r.tokens;
    return seen;
  });
}

function traces(records, key, label, opts) {
  const xs = xValues(records, opts.axis);
  const out = [];
  for (const split of ["train", "eval"]) {
    const picked = records.map((r, i) => [r, xs[i]]).filter(([r]) => r.split === split && typeof r[key] === "number");
    if (!picked.length) continue;
    const y = picked.map(([r]) => r[key]);
    out.push({
      x: picked.map(([, x]) => x),
      y: split === "train" ? smooth(y, opts.smoothing) : y,
      customdata: y,
      name: label ? `${label} ${split}` : split,
      mode: split === "eval" || picked.length < 3 ? "lines+markers" : "lines",
      hovertemplate: `${split} %{x}: %{customdata:.5g}<extra>${label || key}</extra>`,
    });
  }
  return out;
}

function drawCharts(container, series, opts) {
  // series: [{label, records}]; one chart per metric key, each run a trace
  const keys = metricKeys(series.flatMap((s) => s.records));
  for (const key of keys) {
    let div = container.querySelector(`[data-metric="${CSS.escape(key)}"]`);
    if (!div) {
      div = el("div", { class: "chart", "data-metric": key });
      container.append(div);
    }
    const data = series.flatMap((s) => traces(s.records, key, s.label, opts));
    const layout = {
      title: { text: key, font: { size: 13 } },
      margin: { l: 55, r: 15, t: 30, b: 35 },
      xaxis: { title: { text: opts.axis === "tokens" ? "tokens seen" : "step" } },
      yaxis: { type: opts.log ? "log" : "linear" },
      legend: { orientation: "h" },
      showlegend: data.length > 1,
    };
    Plotly.react(div, data, layout, { displaylogo: false, responsive: true });
  }
}

function chartControls(opts, redraw, withAxis) {
  const smoothing = el("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: opts.smoothing, id: "smoothing" });
  smoothing.oninput = () => { opts.smoothing = Number(smoothing.value); redraw(); };
  const log = el("input", { type: "checkbox", id: "log-scale" });
  log.onchange = () => { opts.log = log.checked; redraw(); };
  const axis = el("select", { id: "x-axis" }, el("option", { value: "step" }, "by step"),
    el("option", { value: "tokens" }, "by tokens seen"));
  axis.onchange = () => { opts.axis = axis.value; redraw(); };
  return el("div", { class: "controls" },
    el("label", {}, "smoothing ", smoothing), el("label", {}, log, " log scale"), withAxis ? axis : null);
}

// ---------------------------------------------------------------- views

async function runList(view, compareMode) {
  const data = await api("/api/runs");
  const pipelines = [...new Set(data.runs.map((r) => r.pipeline))].sort();
  const filter = el("select", { id: "pipeline-filter" }, el("option", { value: "" }, "all pipeline runs"),
    pipelines.filter((p) => p).map((p) => {
      const state = (data.runs.find((r) => r.pipeline === p) || {}).pipeline_state;
      return el("option", { value: p }, state ? `${p} (${state})` : p);
    }));
  const chosen = new Set();
  const compare = el("button", { id: "compare-button", disabled: true }, "Compare selected");
  compare.onclick = () => { location.hash = `#/compare/${[...chosen].map(encodeURIComponent).join(",")}`; };
  const body = el("tbody");
  const render = () => {
    body.replaceChildren(...data.runs.filter((r) => !filter.value || r.pipeline === filter.value).map((r) => {
      const box = el("input", { type: "checkbox", "data-run": r.id });
      box.onchange = () => {
        if (box.checked) chosen.add(r.id); else chosen.delete(r.id);
        compare.disabled = chosen.size < 2;
      };
      const metric = r.key_metric ? `${r.key_metric.name} (${r.key_metric.split}) ${fmt(r.key_metric.value)}` : "";
      const gate = r.gate ? el("span", { class: r.gate.passed ? "pass" : "fail" }, r.gate.passed ? "passed" : "FAILED") : "";
      return el("tr", { "data-run": r.id }, el("td", {}, box), el("td", {}, runLink(r.id)), el("td", {}, r.stage),
        el("td", {}, statusBadge(r.status)), el("td", {}, r.model), el("td", {}, when(r.started)),
        el("td", { class: "num" }, r.step === null || r.step === undefined ? "" : `${r.step}/${fmt(r.total_steps)}`),
        el("td", {}, metric), el("td", {}, gate), el("td", {}, r.problems.length ? `${r.problems.length} problem(s)` : ""));
    }));
  };
  filter.onchange = render;
  render();
  fill(view, 
    el("h1", {}, compareMode ? "Choose two or more runs to compare" : "Runs"),
    el("p", {}, `Roots: ${data.roots.join(", ")}`),
    data.kfp_error ? el("p", { class: "fail", id: "kfp-error" }, `Kubeflow Pipelines: ${data.kfp_error}`) : null,
    problemsBox(data.root_problems),
    el("div", { class: "controls" }, filter, compare),
    el("table", { id: "runs" }, el("thead", {}, el("tr", {}, ["", "run", "stage", "status", "model", "started",
      "step", "key metric", "gate", "notes"].map((h) => el("th", {}, h)))), body));
}

async function runPage(view, id) {
  const run = await api(`/api/run?id=${encodeURIComponent(id)}`);
  let records = run.metrics;
  let seen = run.metrics_count;  // records on disk (the page may draw fewer: a long run is thinned)
  const opts = { smoothing: 0, log: false, axis: "step" };
  const charts = el("div", { class: "charts", id: "charts" });
  const redraw = () => drawCharts(charts, [{ label: "", records }], opts);
  const stepText = el("span", { id: "run-step" }, run.step === null ? "" : `step ${run.step}/${fmt(run.total_steps)}`);
  const badge = el("span", { id: "run-status" }, statusBadge(run.status));
  fill(view, 
    el("h1", {}, `${run.stage || "run"}: ${run.id}`),
    el("p", {}, badge, " ", stepText, run.model ? ` · ${run.model}` : "", " · ", el("code", {}, run.location)),
    problemsBox(run.problems.concat(run.checkpoints || [])),
    records.length ? el("h2", {}, "Curves") : null,
    records.length ? chartControls(opts, redraw, true) : null,
    run.metrics_stride > 1 ? el("p", { id: "thinned" }, `${run.metrics_count.toLocaleString()} records: every ` +
      `${run.metrics_stride}th train record is drawn (and every eval record); new ones are all drawn`) : null,
    charts,
    el("section", { id: "samples" }),
    el("section", { id: "evaluation" }),
    releaseSection(run.release),
    taskSection(run.task_outputs),
    configSection(run),
    lineageSection(run.release && run.release.lineage ? run.release.lineage : run.lineage));
  redraw();
  if (run.has.includes("samples.jsonl")) await samplesSection(view.querySelector("#samples"), id);
  if (run.evaluation) evaluationSection(view.querySelector("#evaluation"), run);
  if (run.status === "running" || run.status === "stale" || run.status === "unknown") {
    timer = setInterval(async () => {
      const fresh = await api(`/api/metrics?id=${encodeURIComponent(id)}&after=${seen}`);
      if (fresh.count < seen) { route(); return; }  // rewritten (a resumed run drops the replayed steps)
      seen = fresh.count;
      if (fresh.records.length) { records = records.concat(fresh.records); redraw(); }
      badge.replaceChildren(statusBadge(fresh.status));
      stepText.textContent = fresh.step === null ? "" : `step ${fresh.step}/${fmt(run.total_steps)}`;
      document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
      if (fresh.status !== "running" && fresh.status !== "stale" && fresh.status !== "unknown") clearInterval(timer);
    }, POLL_MS);
  }
}

async function samplesSection(section, id) {
  const min = el("input", { type: "number", step: "any", id: "min-reward", placeholder: "min" });
  const max = el("input", { type: "number", step: "any", id: "max-reward", placeholder: "max" });
  const stepSelect = el("select", { id: "sample-step" }, el("option", { value: "" }, "every logged step"));
  const list = el("div", { id: "sample-list" });
  const count = el("span", { id: "sample-count" });
  const load = async () => {
    const query = new URLSearchParams({ id, min: min.value, max: max.value, step: stepSelect.value });
    const data = await api(`/api/samples?${query}`);
    if (stepSelect.options.length === 1) {
      for (const step of data.steps) stepSelect.append(el("option", { value: step }, `step ${step}`));
    }
    count.textContent = `${data.rows.length} of ${data.total} shown`;
    fill(list, problemsBox(data.problems), data.rows.map(sampleCard));
  };
  for (const input of [min, max, stepSelect]) input.onchange = load;
  fill(section, el("h2", {}, "Samples"),
    el("div", { class: "controls" }, el("label", {}, "reward (pairs: margin) from ", min), el("label", {}, " to ", max),
      stepSelect, count), list);
  await load();
}

function sampleCard(row) {
  if (row.kind === "pair") {
    return el("div", { class: "sample", "data-kind": "pair" },
      el("div", { class: "meta" }, `step ${row.step} · chosen ${fmt(row.chosen_reward)} · rejected ${fmt(row.rejected_reward)} · margin ${fmt(row.margin)}`),
      el("pre", { class: "text prompt" }, row.prompt),
      el("div", { class: "cols" }, el("div", {}, el("strong", {}, "chosen"), el("pre", { class: "text chosen" }, row.chosen)),
        el("div", {}, el("strong", {}, "rejected"), el("pre", { class: "text rejected" }, row.rejected))));
  }
  const sources = Object.entries(row.rewards || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  return el("div", { class: "sample", "data-kind": "rollout", "data-reward": row.reward },
    el("div", { class: "meta" }, `step ${row.step} · group ${row.group} · reward ${fmt(row.reward)}` +
      (sources ? ` (${sources})` : "") + ` · advantage ${fmt(row.advantage)} · ${row.length} tokens` +
      (row.finished ? "" : " · cut at max_new_tokens")),
    el("pre", { class: "text prompt" }, row.prompt),
    row.episode ? episodeBox(row.episode) : el("pre", { class: "text completion" }, row.completion));
}

// A multi-turn episode (GRPO with env.class): the whole transcript after the prompt, with its turns, step
// rewards, why it ended and its tool calls.
function episodeBox(ep) {
  const rewards = (ep.rewards || []).map(fmt).join(", ");
  return el("div", { class: "episode" },
    el("div", { class: "meta" }, `${ep.turns} turns · ended: ${ep.done_reason} · step rewards ${rewards} · ` +
      `${ep.tool_calls} tool calls, ${ep.malformed_tool_calls ?? 0} malformed, ${ep.tool_errors} failed`),
    el("pre", { class: "text transcript" }, ep.transcript));
}

function evaluationSection(section, run) {
  const ev = run.evaluation;
  const models = Object.keys(ev.models || {});
  const metrics = [...new Set(models.flatMap((m) => Object.keys(ev.models[m] || {})))].sort();
  const parts = [el("h2", {}, "Evaluation")];
  if (ev.gate) {
    const rules = (ev.gate.rules || []).concat(((ev.gate.served || {}).rules) || []);
    parts.push(el("p", { id: "gate-verdict" }, "Gate: ",
      el("span", { class: ev.gate.passed ? "pass" : "fail" }, ev.gate.passed ? "passed" : "FAILED"),
      ` (candidate ${ev.gate.candidate || ""}${ev.gate.baseline ? `, baseline ${ev.gate.baseline}` : ""})`));
    parts.push(table(["rule", "value", "threshold", "outcome", "detail"], rules.map((r) =>
      el("tr", { "data-rule": r.rule, "data-passed": String(r.passed) }, el("td", {}, r.rule),
        el("td", { class: "num" }, fmt(r.value)), el("td", { class: "num" }, fmt(r.threshold)),
        el("td", {}, el("span", { class: r.passed ? "pass" : "fail" }, r.passed ? "ok" : "FAILED")),
        el("td", {}, r.detail))), { id: "gate-rules" }));
  }
  parts.push(table(["model", ...metrics], models.map((m) => el("tr", { "data-model": m }, el("td", {}, m),
    metrics.map((k) => el("td", { class: "num" }, fmt(ev.models[m][k]))))), { id: "eval-metrics" }));
  const sets = Object.keys(ev.per_problem || {});
  if (sets.length) {
    const pick = el("select", { id: "per-problem-set" }, sets.map((s) => el("option", { value: s }, s)));
    const holder = el("div", { id: "per-problem" });
    const show = () => {
      const rows = ev.per_problem[pick.value] || [];
      const keys = [...new Set(rows.flatMap((r) => Object.keys(r)))];
      holder.replaceChildren(table(keys, rows.slice(0, 200).map((r) => el("tr", {}, keys.map((k) =>
        el("td", {}, typeof r[k] === "string" && r[k].length > 60 ? el("pre", { class: "text" }, r[k]) : fmt(r[k])))))));
    };
    pick.onchange = show;
    show();
    parts.push(el("h2", {}, "Per-problem results"), pick, holder);
  }
  if (ev.report) {
    parts.push(el("p", {}, el("a", { href: `/report?id=${encodeURIComponent(run.id)}`, target: "_blank", rel: "noopener" },
      "The evaluation's report (report.html)")));
  }
  for (const name of ev.plots || []) {
    parts.push(el("img", { class: "plot", alt: name, src: `/api/plot?id=${encodeURIComponent(run.id)}&name=${encodeURIComponent(name)}` }));
  }
  parts.push(problemsBox(ev.problems));
  fill(section, parts);
}

function releaseSection(release) {
  // what a release records beyond the stages' chain: the base model, data, image, commit and KFP run
  if (!release) return null;
  const lineage = release.lineage || {};
  const rows = [
    ["released at", release.released_at], ["source", release.source], ["candidate", release.candidate],
    ["gate", release.gate ? (release.gate.passed ? "passed" : "FAILED") : ""],
    ["base model", lineage.base_model && `${lineage.base_model.location || ""} ${lineage.base_model.revision || ""}`],
    ["posttrain", lineage.posttrain && `${lineage.posttrain.version || ""} ${lineage.posttrain.commit || ""}`],
    ["image", lineage.image && JSON.stringify(lineage.image)], ["KFP run", lineage.kfp && JSON.stringify(lineage.kfp)],
    ...Object.entries(lineage.data || {}).map(([name, item]) => [`data ${name}`,
      `${item.location} (${String(item.fingerprint || "").slice(0, 16)})`]),
  ];
  return el("section", { id: "release" }, el("h2", {}, "Release"),
    table(["", ""], rows.filter(([, v]) => v).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v)))));
}

function taskSection(outputs) {
  // a KFP task's outputs (executor_output.json): artifacts with their metadata, output parameters
  if (!outputs || !outputs.length) return null;
  return el("section", { id: "task-outputs" }, el("h2", {}, "Task outputs"),
    table(["output", "where", "metadata or value"], outputs.map((o) => el("tr", { "data-output": o.name },
      el("td", {}, o.name), el("td", {}, o.uri || ""),
      el("td", {}, "value" in o ? fmt(o.value) : Object.entries(o.metadata || {}).map(([k, v]) => `${k}: ${fmt(v)}`).join(", "))))));
}

function configSection(run) {
  const entries = Object.entries(run.config || {});
  if (!entries.length) return null;
  return el("details", { id: "config" }, el("summary", {}, `Config (${entries.length} keys)`),
    table(["key", "value"], entries.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, fmt(v))))));
}

function lineageSection(lineage) {
  const stages = (lineage && lineage.stages) || [];
  if (!stages.length) return null;
  return el("section", { id: "lineage" }, el("h2", {}, "Lineage"),
    table(["stage", "created", "output", "inputs"], stages.map((s) => el("tr", {}, el("td", {}, s.stage),
      el("td", {}, s.created), el("td", {}, s.output),
      el("td", {}, Object.entries(s.inputs || {}).map(([key, items]) => el("div", {}, `${key}: ` +
        items.map((i) => `${i.location} (${String(i.fingerprint || "").slice(0, 16)})`).join(", "))))))));
}

async function comparePage(view, ids) {
  if (ids.length < 2) return runList(view, true);
  const data = await api(`/api/compare?${ids.map((i) => `id=${encodeURIComponent(i)}`).join("&")}`);
  const opts = { smoothing: 0, log: false, axis: "step" };
  const charts = el("div", { class: "charts", id: "charts" });
  const series = data.runs.map((r) => ({ label: r.id, records: r.metrics }));
  const redraw = () => drawCharts(charts, series, opts);
  const diffs = data.differences;
  fill(view, 
    el("h1", {}, `Comparing ${data.runs.length} runs`),
    el("ul", {}, data.runs.map((r) => el("li", {}, runLink(r.id), " ", r.stage, " ", statusBadge(r.status)))),
    chartControls(opts, redraw, true),
    charts,
    el("h2", {}, "Config differences"),
    diffs.length ? table(["key", ...data.runs.map((r) => r.id)], diffs.map((d) => el("tr", { "data-key": d.key },
      el("td", {}, d.key), data.runs.map((r) => el("td", {}, fmt(d.values[r.id])))))) : el("p", {}, "The configs are the same."));
  redraw();
}

// ---------------------------------------------------------------- routing

async function route() {
  // data-ready names the view once it is drawn (what a test, or a screenshot, waits for)
  document.body.removeAttribute("data-ready");
  clearInterval(timer);
  const view = document.getElementById("view");
  const hash = location.hash.replace(/^#\/?/, "");
  const [page, ...rest] = hash.split("/");
  const arg = rest.join("/");
  try {
    if (page === "run" && arg) await runPage(view, decodeURIComponent(arg));
    else if (page === "compare") await comparePage(view, arg ? arg.split(",").map(decodeURIComponent) : []);
    else await runList(view, false);
    document.body.setAttribute("data-ready", location.hash || "#/");
  } catch (error) {
    fill(view, el("p", { class: "fail", id: "error" }, `Could not load this view: ${error.message}`));
    document.body.setAttribute("data-ready", "error");
  }
}

window.addEventListener("hashchange", route);
route();
