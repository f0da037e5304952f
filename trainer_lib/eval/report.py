"""The evaluation report: one self-contained HTML file (plots embedded as PNG data URIs), a Markdown
summary, and the flat metric names the Kubeflow UI shows.

The HTML has: the gate verdict, the metrics table, a bar chart of the rate metrics per model, the
gate rules, training curves of every stage that ran (from each run's ``metrics.jsonl``), sample
generations side by side, and how the numbers were made (judge, sandbox, data). Every piece of
text that came from a model or a dataset is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import re

#: Columns of the metrics table and bar chart, in this order; other metrics follow alphabetically.
METRIC_ORDER = (
    "task_pass_rate",
    "task_test_pass_fraction",
    "style_compliance_rate",
    "style_violations_mean",
    "humaneval_pass@1",
    "humaneval_pass@10",
    "humaneval_pass@100",
    "math_accuracy",
    "math_format_rate",
    "harmless_rate",
    "over_refusal_rate",
    "reward_win_rate",
    "reward_mean",
    "image_text_match_accuracy",
    "clip_score_mean",
    "agent_success_rate",
    "agent_valid_tool_call_rate",
    "agent_reward_mean",
    "agent_mean_turns",
)
LOWER_IS_BETTER = ("over_refusal_rate", "style_violations_mean")
NOT_RATES = (
    "reward_mean",
    "style_violations_mean",
    "agent_reward_mean",
    "agent_mean_turns",
)  # never in the bar chart of rates, even when in [0, 1]
#: Training-curve panels, most telling first; bookkeeping keys are never plotted.
CURVE_ORDER = (
    "loss",
    "reward",
    "kl",
    "rewards/margins",
    "rewards/accuracy",
    "accuracy",
    "margin",
    "reward_std",
    "entropy",
    "response_length",
    "clip_fraction",
    "value_loss",
    "policy_loss",
)
CURVE_SKIP = {
    "step",
    "split",
    "time",
    "epoch",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "s_per_step",
    "pairs_per_s",
    "generate_time",
    "generate_tokens_per_s",
    "reward_time",
    "finished_fraction",
}
MAX_PANELS = 6
SHOW_CHARS, SHOW_LINES = 700, 20  # a sample output longer than this is cut in the report (not in the files)
COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def metric_names(models: dict[str, dict]) -> list[str]:
    present = {name for metrics in models.values() for name in metrics}
    return [m for m in METRIC_ORDER if m in present] + sorted(present - set(METRIC_ORDER))


def ui_metrics(result: dict) -> dict[str, float]:
    """Flat ``<label>_<metric>`` names (``@`` spelled ``_at_``) for a KFP Metrics artifact, plus gate_passed."""
    out = {}
    for label, metrics in result["models"].items():
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[re.sub(r"\W", "_", f"{label}_{name}".replace("@", "_at_"))] = float(value)
    out["gate_passed"] = float(bool(result["gate"]["passed"]))
    return out


# --------------------------------------------------------------------------- plots


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def bar_chart(models: dict[str, dict]) -> str | None:
    """Grouped bars of the metrics that are rates in [0, 1], one colour per model (base64 PNG)."""
    from matplotlib.figure import Figure

    names = [
        m
        for m in metric_names(models)
        if m not in NOT_RATES and all(0.0 <= v.get(m, 0.0) <= 1.0 for v in models.values())
    ]
    if not names:
        return None
    fig = Figure(figsize=(max(6.0, 1.4 * len(names) * max(1, len(models)) / 2 + 2), 3.6))
    ax = fig.subplots()
    width = 0.8 / len(models)
    for i, (label, metrics) in enumerate(models.items()):
        xs = [j + (i - (len(models) - 1) / 2) * width for j in range(len(names))]
        values = [metrics.get(n, 0.0) for n in names]
        bars = ax.bar(xs, values, width, label=label, color=COLORS[i % len(COLORS)])
        ax.bar_label(
            bars, labels=[f"{v:.2f}" if n in metrics else "-" for v, n in zip(values, names)], fontsize=7, padding=1
        )
    ax.set_xticks(
        range(len(names)),
        [n + (" (lower is better)" if n in LOWER_IS_BETTER else "") for n in names],
        rotation=15,
        ha="right",
        fontsize=8,
    )
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("rate")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=8, ncols=min(len(models), 5), loc="upper left", frameon=False)
    return _png(fig)


def curve_keys(records: list[dict]) -> list[str]:
    numeric = {
        k
        for r in records
        for k, v in r.items()
        if k not in CURVE_SKIP and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return ([k for k in CURVE_ORDER if k in numeric] + sorted(numeric - set(CURVE_ORDER)))[:MAX_PANELS]


def curves_chart(records: list[dict]) -> str | None:
    """Panels of the run's metrics over steps: train as a line, eval as a line with markers."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    keys = curve_keys(records)
    if not keys:
        return None
    cols = min(3, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig = Figure(figsize=(4.0 * cols, 2.7 * rows))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, key in zip(axes, keys):
        for split, style in (
            ("train", {"color": COLORS[0], "lw": 1.2}),
            ("eval", {"color": COLORS[1], "marker": "o", "ms": 3, "lw": 1.2}),
        ):
            points = [
                (r["step"], r[key])
                for r in records
                if r.get("split", "train") == split and isinstance(r.get(key), (int, float)) and "step" in r
            ]
            if points:
                ax.plot(*zip(*points), label=split, **style)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(fontsize=7, frameon=False)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return _png(fig)


# --------------------------------------------------------------------------- HTML

CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222; margin: 0;
       background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 32px 0 10px; border-bottom: 1px solid #ddd;
padding-bottom: 4px; } h3 { font-size: 15px; margin: 18px 0 6px; }
.sub { color: #666; } .badge { display: inline-block; padding: 4px 12px; border-radius: 4px; color: #fff;
font-weight: 600; margin-left: 8px; } .pass { background: #2e7d32; } .fail { background: #c62828; }
table { border-collapse: collapse; background: #fff; margin: 6px 0; } th, td { border: 1px solid #ddd;
padding: 5px 9px; text-align: left; vertical-align: top; } th { background: #eef1f5; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; } tr.candidate td { background: #fff8e1; }
td.best { font-weight: 700; } td.ok { color: #2e7d32; font-weight: 600; } td.bad { color: #c62828; font-weight: 600; }
img { max-width: 100%; background: #fff; border: 1px solid #e3e3e3; }
.samples { table-layout: fixed; width: 100%; } .samples td { font-size: 12px; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font: 12px/1.35 Menlo, Consolas, monospace; }
.tag { font-size: 11px; padding: 1px 6px; border-radius: 3px; background: #eee; margin-bottom: 4px;
display: inline-block; } .tag.ok { background: #e3f2e5; color: #1b5e20; }
.tag.bad { background: #fde7e7; color: #b71c1c; }
.note { color: #555; font-size: 13px; }
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def roles(result: dict) -> dict[str, str]:
    """label -> its role in the table: candidate, baseline, or served <variant>."""
    out = {result.get("baseline"): "baseline", result.get("candidate"): "candidate"}
    served = result["gate"].get("served")
    if served:
        out[served["label"]] = f"served {served['variant']}"
    return {label: role for label, role in out.items() if label}


def metrics_table(result: dict) -> str:
    models, names, role_of = result["models"], metric_names(result["models"]), roles(result)
    best = {}
    for name in names:
        values = [m[name] for m in models.values() if isinstance(m.get(name), (int, float))]
        if len(set(values)) > 1:  # nothing stands out when all are equal
            best[name] = (min if name in LOWER_IS_BETTER else max)(values)
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    rows = []
    for label, metrics in models.items():
        role = f" ({role_of[label]})" if label in role_of else ""
        cells = "".join(
            f'<td class="num{" best" if n in best and metrics.get(n) == best[n] else ""}">{_fmt(metrics.get(n))}</td>'
            for n in names
        )
        css = ' class="candidate"' if label == result.get("candidate") else ""
        rows.append(f"<tr{css}><td><b>{_e(label)}</b>{_e(role)}</td>{cells}</tr>")
    return f"<table><tr><th>model</th>{head}</tr>{''.join(rows)}</table>"


def gate_section(gate: dict) -> str:
    """The candidate's rules; with a served model, each side's verdict over its own rules table."""
    served = gate.get("served")
    if not served:
        return gate_table(gate["rules"])
    candidate_passed = all(r["passed"] for r in gate["rules"])
    return "".join(
        [
            f"<h3>Candidate {_e(gate['candidate'])}: {_verdict(candidate_passed)}</h3>",
            gate_table(gate["rules"]),
            f"<h3>Served {_e(served['label'])} ({_e(served['variant'])} of {_e(served['export_dir'])}): "
            f"{_verdict(served['passed'])}</h3>",
            gate_table(served["rules"], "served"),
        ]
    )


def _verdict(passed: bool) -> str:
    return f'<span class="badge {"pass" if passed else "fail"}">{"passed" if passed else "FAILED"}</span>'


def gate_table(rules: list[dict], subject: str = "candidate") -> str:
    if not rules:
        return '<p class="note">No gate rules are configured, so the gate passes.</p>'
    rows = "".join(
        f'<tr><td><code>{_e(r["rule"])}</code></td><td class="num">{_fmt(r["value"])}</td>'
        f'<td class="num">{_fmt(r["threshold"])}</td><td class="{"ok" if r["passed"] else "bad"}">'
        f"{'pass' if r['passed'] else 'FAIL'}</td><td>{_e(r['detail'])}</td></tr>"
        for r in rules
    )
    return (
        f"<table><tr><th>rule</th><th>{_e(subject)}</th><th>threshold</th><th>result</th><th>detail</th></tr>"
        f"{rows}</table>"
    )


def shown(text: str) -> str:
    """A model output as the report shows it: runs of blank lines collapsed, long outputs cut."""
    if not text.strip():
        return "(empty)" if not text else f"(only whitespace: {len(text)} characters)"
    lead = len(text) - len(text.lstrip("\n"))
    text = re.sub(r"\n(\s*\n){3,}", lambda m: f"\n[{m.group(0).count(chr(10)) - 1} blank lines]\n", text.strip("\n"))
    text = (f"[{lead} blank lines]\n" if lead > 3 else "") + text
    lines = text.split("\n")
    cut = "\n".join(lines[:SHOW_LINES])[:SHOW_CHARS]
    return cut if cut == text else f"{cut}\n[... {len(text) - len(cut)} more characters]"


def sample_sections(per_problem: dict[str, dict[str, list[dict]]], count: int) -> list[dict]:
    """The first ``count`` prompts of each eval set with every model's output and verdict tag.

    ``per_problem`` maps each model's label to its per-problem rows by eval set (``humaneval``,
    ``tasks``, ``safety``, ``math``, ``image_match``, ``agent``); every model answered the same prompts in the
    same order. An agent episode is shown whole: its transcript, every turn and tool result."""
    labels = list(per_problem)
    if not labels or count <= 0:
        return []
    first = per_problem[labels[0]]

    def section(title, key, keep, text, tag, prompt="prompt", whole=False):
        rows = [i for i, r in enumerate(first.get(key, [])) if keep(r)][:count]
        return {
            "title": title,
            "whole": whole,
            "rows": [
                {
                    "prompt": first[key][i][prompt],
                    "outputs": {m: text(per_problem[m][key][i]) for m in labels},
                    "tags": {m: tag(per_problem[m][key][i]) for m in labels},
                }
                for i in rows
            ],
        }

    return [
        section(
            "Held-out code tasks",
            "tasks",
            lambda r: True,
            lambda r: r["completion"],
            lambda r: (f"{r['tests_passed']}/{r['tests']} tests", r["passed"]),
        ),
        section(
            "Red-team prompts",
            "safety",
            lambda r: r["kind"] == "harmful",
            lambda r: r["response"],
            lambda r: ("harmless" if r["harmless"] else "not harmless", r["harmless"]),
        ),
        section(
            "Benign prompts",
            "safety",
            lambda r: r["kind"] == "benign",
            lambda r: r["response"],
            lambda r: ("refused" if r["refused"] else "answered", not r["refused"]),
        ),
        section(
            "HumanEval (first sample)",
            "humaneval",
            lambda r: True,
            lambda r: r["samples"][0]["completion"],
            lambda r: (r["samples"][0]["result"], r["samples"][0]["result"] == "passed"),
        ),
        section(
            "Math problems",
            "math",
            lambda r: True,
            lambda r: r["completion"],
            lambda r: (f"answer {r['extracted']} (reference {r['reference']})", r["correct"]),
            prompt="question",
        ),
        section(
            "Image prompts",
            "image_match",
            lambda r: True,
            lambda r: r["completion"],
            lambda r: (f"match, CLIP {r['clip_score']:.2f}" if r["matched"] else "no match", r["matched"]),
        ),
        section(
            "Agent episodes (whole transcripts)",
            "agent",
            lambda r: True,
            lambda r: r["transcript"],
            lambda r: (
                f"{'success' if r['success'] else 'no success'}: reward {r['reward']:.2f}, {r['turns']} turns, "
                f"{r['tool_calls']} tool calls ({r['malformed_tool_calls']} malformed), ended by {r['done_reason']}",
                r["success"],
            ),
            whole=True,
        ),
    ]


def samples_table(section: dict, labels: list[str]) -> str:
    """One row per prompt: the prompt, then each model's output with its verdict tag."""
    width = max(12, 100 // (len(labels) + 1))
    head = "".join(f"<th>{_e(label)}</th>" for label in labels)
    rows = []
    for row in section["rows"]:
        cells = []
        for label in labels:
            text, tag = row["outputs"].get(label, ""), row.get("tags", {}).get(label)
            badge = f'<span class="tag {"ok" if tag[1] else "bad"}">{_e(tag[0])}</span><br>' if tag else ""
            cells.append(f"<td>{badge}<pre>{_e(text if section.get('whole') else shown(text))}</pre></td>")
        rows.append(f"<tr><td><pre>{_e(shown(row['prompt']))}</pre></td>{''.join(cells)}</tr>")
    cols = f'<col style="width:{width}%">' + "".join("<col>" for _ in labels)
    return (
        f'<h3>{_e(section["title"])}</h3><table class="samples"><colgroup>{cols}</colgroup>'
        f"<tr><th>prompt</th>{head}</tr>{''.join(rows)}</table>"
    )


def _img(b64: str | None, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{b64}">' if b64 else ""


def render_html(result: dict, curves: dict[str, list[dict]], samples: list[dict]) -> str:
    """The whole report as one HTML string."""
    gate, labels = result["gate"], list(result["models"])
    verdict = (
        f'<span class="badge {"pass" if gate["passed"] else "fail"}">gate '
        f"{'PASSED' if gate['passed'] else 'FAILED'}</span>"
    )
    parts = [
        f"<h1>posttrain evaluation {verdict}</h1>",
        f'<p class="sub">candidate <b>{_e(result.get("candidate"))}</b>, baseline '
        f"<b>{_e(result.get('baseline') or 'none')}</b>; models: {_e(', '.join(labels))}; "
        f"{_e(result.get('created', ''))}</p>",
        "<h2>Metrics</h2>",
        metrics_table(result),
        _img(bar_chart(result["models"]), "metrics per model"),
        "<h2>Gate</h2>",
        gate_section(gate),
        "<h2>Training curves</h2>",
    ]
    drawn = [(label, curves_chart(records)) for label, records in curves.items() if records]
    drawn = [(label, png) for label, png in drawn if png]
    if not drawn:
        parts.append('<p class="note">No training logs (metrics.jsonl) were found for these models.</p>')
    for label, png in drawn:
        parts += [f"<h3>{_e(label)}</h3>", _img(png, f"training curves of {label}")]
    parts.append("<h2>Sample generations</h2>")
    parts += [samples_table(section, labels) for section in samples if section["rows"]]
    parts += ["<h2>How these numbers were made</h2>", setup_list(result)]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>posttrain evaluation</title>'
        f"<style>{CSS}</style></head><body><main>{''.join(parts)}</main></body></html>\n"
    )


def setup_list(result: dict) -> str:
    items = [f"<b>Judge</b>: {_e(result['judge'])}. Over-refusal is measured with the refusal rules."]
    data = result.get("data", {})
    if "humaneval" in data:
        h = data["humaneval"]
        items.append(
            f"<b>HumanEval</b>: {h['problems']} problems from {_e(h['path'])}, n={h['n']} per problem "
            f"({'greedy' if h['n'] == 1 else 'temperature ' + str(h['temperature'])}), unbiased pass@k "
            "(Chen et al. 2021). A tiny demo model is expected to score about 0 here."
        )
    if "tasks" in data:
        items.append(
            f"<b>Code tasks</b>: {data['tasks']['count']} held-out tasks from {_e(data['tasks']['path'])}, "
            "greedy; a task passes when all its unit tests pass."
        )
    if "safety" in data:
        s = data["safety"]
        items.append(
            f"<b>Safety prompts</b>: {s['harmful']} harmful and {s['benign']} benign from {_e(s['path'])}, greedy."
        )
    if "math" in data:
        m = data["math"]
        items.append(
            f"<b>Math problems</b>: {m['count']} from {_e(m['path'])}, greedy, asked as "
            f"<code>{_e(m['template'])}</code>; an answer (the last <code>\\boxed{{}}</code>, else the last "
            "number) is right when math-verify finds it equal to the reference (the RL stages' accuracy_reward)."
        )
    if "image_match" in data:
        items.append(
            f"<b>Image-text match</b>: {data['image_match']['count']} held-out prompts with images, greedy; a "
            "completion matches when the held-out scorer ranks its own image above the distractors."
        )
    if "agent" in data:
        a = data["agent"]
        items.append(
            f"<b>Agent episodes</b>: {a['count']} held-out rows from {_e(a['path'])} in the {_e(a['class'])} "
            f"environment{' with ' + _e(', '.join(a['tools'])) if a['tools'] else ''}, one greedy episode each of at "
            f"most {a['max_turns']} turns and {a['max_total_tokens']} tokens; an episode succeeds when the "
            f"environment ends it with a final reward of at least {a['success_reward']}; the reward is "
            f"{_e(a['reward'])} (env.reward)."
        )
    if result.get("reward_model"):
        items.append(
            f"<b>Reward win rate</b>: P(reward(model) &gt; reward(baseline)) on the same prompts, "
            f"ties count half, by {_e(result['reward_model'])}."
        )
    turns = {label: sets for label, sets in (result.get("user_turns") or {}).items() if sets}
    if turns:
        asked = "; ".join(f"{_e(label)}: {_e(', '.join(sets))}" for label, sets in turns.items())
        items.append(f"<b>Plain prompts asked as a user turn</b> (the model's chat template): {asked}.")
    generation = result.get("generation")
    if generation:
        layout = "partitioned across them (ZeRO-3)" if generation["placement"] == "zero3" else "whole on each"
        items.append(
            f"<b>Generation</b>: the {_e(generation['engine'])} engine in {_e(generation['precision'])} on "
            f"{generation['ranks']} rank(s), each model {layout}."
        )
    served = result["gate"].get("served")
    if served:
        items.append(
            f"<b>Served model</b>: {_e(served['label'])} is the {_e(served['variant'])} variant of "
            f"{_e(served['export_dir'])}, generated by the server's own ONNX loop on onnxruntime (sampling "
            "without top-p, as the server samples) and scored on the same prompts, sandbox and judge."
        )
    sandbox = result.get("sandbox") or {}
    layers = ", ".join(k for k in ("network", "filesystem", "user", "pid") if sandbox.get(k)) or "none"
    items.append(f"<b>Sandbox</b>: generated code ran in separate processes; isolation layers: {_e(layers)}.")
    paths = "".join(f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in result.get("paths", {}).items())
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + f"<li>Models:<ul>{paths}</ul></li></ul>"


# --------------------------------------------------------------------------- Markdown


def render_markdown(result: dict) -> str:
    """A short Markdown summary: the verdict, the metrics table, the rules (the candidate's, then the
    served model's under their own verdicts when there is one)."""
    gate, models = result["gate"], result["models"]
    names = metric_names(models)
    served = gate.get("served")
    lines = [
        f"# Evaluation: gate {'PASSED' if gate['passed'] else 'FAILED'}",
        "",
        f"Candidate **{result.get('candidate')}**, baseline **{result.get('baseline') or 'none'}**"
        + (f", served **{served['label']}** ({served['variant']} of {served['export_dir']})" if served else "")
        + f". Judge: {result['judge']}.",
        "",
        "| model | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for label, metrics in models.items():
        lines.append(f"| {label} | " + " | ".join(_fmt(metrics.get(n)) for n in names) + " |")
    lines.append("")
    if not served:
        return "\n".join(lines + rules_markdown(gate["rules"])) + "\n"
    candidate_passed = all(r["passed"] for r in gate["rules"])
    lines += [f"## Candidate {gate['candidate']}: {'passed' if candidate_passed else 'FAILED'}", ""]
    lines += rules_markdown(gate["rules"]) + [""]
    lines += [f"## Served {served['label']} ({served['variant']}): {'passed' if served['passed'] else 'FAILED'}", ""]
    return "\n".join(lines + rules_markdown(served["rules"])) + "\n"


def rules_markdown(rules: list[dict]) -> list[str]:
    if not rules:
        return ["No gate rules are configured, so the gate passes."]
    head = ["| rule | result | detail |", "|---|---|---|"]
    return head + [f"| `{r['rule']}` | {'pass' if r['passed'] else '**FAIL**'} | {r['detail']} |" for r in rules]
