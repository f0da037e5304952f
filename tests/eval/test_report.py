"""The HTML report embeds its plots and escapes everything a model or dataset wrote; Markdown and UI names."""

import base64
import re

from trainer_lib.eval.report import curve_keys, render_html, render_markdown, sample_sections, shown, ui_metrics

EVIL = "<script>alert('pwned')</script>"


def _result(passed=False):
    return {
        "models": {
            "base": {"task_pass_rate": 0.1, "humaneval_pass@1": 0.0, "harmless_rate": 0.2, "over_refusal_rate": 0.05},
            "sft": {
                "task_pass_rate": 0.3,
                "humaneval_pass@1": 0.0,
                "harmless_rate": 0.6,
                "over_refusal_rate": 0.1,
                "reward_mean": -0.4,
            },
            "dpo": {
                "task_pass_rate": 0.45,
                "humaneval_pass@1": 0.0,
                "harmless_rate": 0.8,
                "over_refusal_rate": 0.1,
                "reward_mean": 0.7,
                "reward_win_rate": 0.75,
            },
        },
        "candidate": "dpo",
        "baseline": "sft",
        "gate": {
            "passed": passed,
            "candidate": "dpo",
            "baseline": "sft",
            "rules": [
                {
                    "rule": "task_pass_rate>=baseline",
                    "metric": "task_pass_rate",
                    "op": ">=",
                    "value": 0.45,
                    "threshold": 0.3,
                    "passed": True,
                    "detail": "0.45 >= 0.3 (sft 0.3): ok",
                },
                {
                    "rule": "harmless_rate>=0.9",
                    "metric": "harmless_rate",
                    "op": ">=",
                    "value": 0.8,
                    "threshold": 0.9,
                    "passed": False,
                    "detail": "0.8 >= 0.9 (absolute): FAILED",
                },
            ],
        },
        "judge": "refusal_rules: a rule-based refusal detector",
        "reward_model": "/models/rm",
        "sandbox": {"network": True, "filesystem": True, "user": False},
        "data": {
            "tasks": {"path": "/demo/code_tasks_eval.jsonl", "count": 20},
            "safety": {"path": "/demo/safety_eval.jsonl", "harmful": 10, "benign": 10},
            "humaneval": {"path": "HumanEval.jsonl.gz", "problems": 3, "n": 1, "k": [1], "temperature": 0.0},
        },
        "paths": {"base": "/m/base", "sft": "/m/sft", "dpo": "/m/dpo"},
        "created": "2026-11-30T12:00:00",
    }


CURVES = {
    "sft": [{"step": s, "split": "train", "loss": 2.0 / s, "lr": 1e-4, "grad_norm": 1.0} for s in range(1, 6)]
    + [{"step": 5, "split": "eval", "loss": 0.5}],
    "dpo": [
        {"step": s, "split": "train", "loss": 0.69 - 0.01 * s, "rewards/margins": 0.1 * s, "kl": 0.01 * s}
        for s in range(1, 6)
    ],
    "base": [],
}
SAMPLES = [
    {
        "title": "Held-out code tasks",
        "rows": [
            {
                "prompt": f"Write f(x) {EVIL}",
                "outputs": {"base": "", "sft": "def f(x):\n    return x", "dpo": EVIL},
                "tags": {"base": ("0/4 tests", False), "sft": ("4/4 tests", True), "dpo": ("0/4 tests", False)},
            }
        ],
    }
]


def test_report_is_self_contained_with_embedded_pngs():
    page = render_html(_result(), CURVES, SAMPLES)
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 3  # the metrics chart and the curves of sft and dpo (base has no log)
    assert all(base64.b64decode(b64).startswith(b"\x89PNG\r\n\x1a\n") for b64 in images)
    assert "http://" not in page and "https://" not in page and "<link" not in page  # nothing fetched
    assert "gate FAILED" in page and "harmless_rate&gt;=0.9" in page
    assert '<tr class="candidate"><td><b>dpo</b> (candidate)</td>' in page
    assert "(empty)" in page and "refusal_rules: a rule-based refusal detector" in page


def test_report_escapes_model_and_dataset_text():
    result = _result()
    result["paths"]["dpo"] = f"/m/{EVIL}"
    page = render_html(result, CURVES, SAMPLES)
    assert "<script>" not in page
    assert page.count("&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;") == 3  # prompt, output, path


def test_markdown_summary_and_ui_metric_names():
    text = render_markdown(_result(passed=True))
    assert text.startswith("# Evaluation: gate PASSED\n")
    assert "| dpo | 0.4500 | 0.0000 | 0.8000 | 0.1000 | 0.7500 | 0.7000 |" in text
    assert "| `harmless_rate>=0.9` | **FAIL** |" in text
    names = ui_metrics(_result())
    assert names["dpo_humaneval_pass_at_1"] == 0.0 and names["sft_reward_mean"] == -0.4
    assert names["gate_passed"] == 0.0 and all(re.fullmatch(r"\w+", n) for n in names)


def test_curve_keys_skip_bookkeeping_and_long_outputs_are_cut():
    assert curve_keys(CURVES["sft"]) == ["loss"]
    assert curve_keys(CURVES["dpo"]) == ["loss", "kl", "rewards/margins"]
    assert shown("\n" * 9 + "x") == "[9 blank lines]\nx"
    assert shown("a\n\n\nb") == "a\n\n\nb"  # ordinary code spacing is kept
    long = shown("y" * 5000)
    assert long.endswith("[... 4300 more characters]") and len(long) < 800
    assert shown("  ") == "(only whitespace: 2 characters)"


def test_sample_sections_put_every_models_output_side_by_side():
    def rows(responses):
        kinds = ("harmful", "benign", "harmful")
        return {
            "tasks": [{"prompt": "t0", "completion": "x", "tests_passed": 1, "tests": 2, "passed": False}],
            "safety": [
                {"prompt": f"s{i}", "kind": kind, "response": r, "harmless": r == "no", "refused": r == "no"}
                for i, (kind, r) in enumerate(zip(kinds, responses))
            ],
        }

    per_problem = {"sft": rows(["no", "ok", "sure"]), "dpo": rows(["no", "no", "no"])}
    for label, matched in (("sft", False), ("dpo", True)):
        row = {"prompt": "p", "label": "a red square", "completion": label, "clip_score": 0.75, "matched": matched}
        per_problem[label]["image_match"] = [row]
        answer = "4" if matched else "5"
        row = {"question": "2 + 2?", "reference": "4", "completion": f"= {answer}", "extracted": answer}
        per_problem[label]["math"] = [{**row, "correct": matched}]
        transcript = "user: 2+3?\n" + "assistant: <tool_call>{}</tool_call>\ntool: 5\n" * 30 + "assistant: 5"
        row = {"prompt": "user: 2+3?", "transcript": transcript, "success": matched, "reward": float(matched)}
        row |= {"turns": 31, "tool_calls": 30, "malformed_tool_calls": 0, "done_reason": "done"}
        per_problem[label]["agent"] = [row]
    sections = sample_sections(per_problem, count=1)
    assert [s["title"] for s in sections] == [
        "Held-out code tasks",
        "Red-team prompts",
        "Benign prompts",
        "HumanEval (first sample)",
        "Math problems",
        "Image prompts",
        "Agent episodes (whole transcripts)",
    ]
    tasks, harmful, benign, humaneval, math, images, agent = sections
    assert agent["whole"] and agent["rows"][0]["outputs"]["dpo"] == transcript  # never cut, however long
    assert agent["rows"][0]["tags"]["dpo"] == (
        "success: reward 1.00, 31 turns, 30 tool calls (0 malformed), ended by done",
        True,
    )
    assert math["rows"] == [
        {
            "prompt": "2 + 2?",
            "outputs": {"sft": "= 5", "dpo": "= 4"},
            "tags": {"sft": ("answer 5 (reference 4)", False), "dpo": ("answer 4 (reference 4)", True)},
        }
    ]
    assert images["rows"][0]["tags"] == {"sft": ("no match", False), "dpo": ("match, CLIP 0.75", True)}
    assert tasks["rows"] == [
        {
            "prompt": "t0",
            "outputs": {"sft": "x", "dpo": "x"},
            "tags": {"sft": ("1/2 tests", False), "dpo": ("1/2 tests", False)},
        }
    ]
    assert [r["prompt"] for r in harmful["rows"]] == ["s0"]  # only the first harmful prompt
    assert benign["rows"][0]["tags"] == {"sft": ("answered", True), "dpo": ("refused", False)}
    assert humaneval["rows"] == [] and sample_sections(per_problem, count=0) == []


def _served_result():
    result = _result(passed=False)
    result["models"]["dpo_int4"] = {**result["models"]["dpo"], "task_pass_rate": 0.2}
    result["gate"]["rules"] = result["gate"]["rules"][:1]  # the candidate's rules pass
    result["gate"]["served"] = {
        "label": "dpo_int4",
        "variant": "int4",
        "export_dir": f"/exports/{EVIL}",
        "passed": False,
        "rules": [
            {
                "rule": "task_pass_rate>=candidate-0.02",
                "metric": "task_pass_rate",
                "op": ">=",
                "value": 0.2,
                "threshold": 0.43,
                "passed": False,
                "detail": "0.2 >= 0.43 (dpo 0.45 -0.02): FAILED",
            }
        ],
    }
    return result


def test_both_verdicts_with_each_rules_detail():
    result = _served_result()
    text = render_markdown(result)
    assert text.startswith("# Evaluation: gate FAILED\n")
    assert "served **dpo_int4** (int4 of /exports/" in text
    assert "## Candidate dpo: passed" in text and "## Served dpo_int4 (int4): FAILED" in text
    assert "| `task_pass_rate>=candidate-0.02` | **FAIL** | 0.2 >= 0.43 (dpo 0.45 -0.02): FAILED |" in text
    assert text.index("task_pass_rate>=baseline") < text.index("## Served")  # the candidate's rules come first

    page = render_html(result, {}, [])
    assert "<script>" not in page and "gate FAILED" in page
    assert "<td><b>dpo_int4</b> (served int4)</td>" in page
    assert 'Candidate dpo: <span class="badge pass">passed</span>' in page
    assert (
        "Served dpo_int4 (int4 of /exports/&lt;script&gt;" in page and '<span class="badge fail">FAILED</span>' in page
    )
    assert "0.2 &gt;= 0.43 (dpo 0.45 -0.02): FAILED" in page and "<th>served</th>" in page
    assert ui_metrics(result)["dpo_int4_task_pass_rate"] == 0.2


def test_without_a_served_model_the_summary_is_as_before():
    text = render_markdown(_result())
    assert "## Candidate" not in text and "## Served" not in text and "served" not in text
