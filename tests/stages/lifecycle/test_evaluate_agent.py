"""posttrain evaluate with env.path: two tiny models (one taught to call the calculator, one barely fitted) play
greedy episodes on held-out questions; the agent metrics go into metrics.json, per_problem, the report (whole
transcripts, escaped) and the gate; bad env settings and engines that cannot play episodes are refused."""

import html
import json

import pytest

from tests.rl.agent_helpers import CALCULATOR_QUESTIONS, teach_calculator
from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")

METRICS = ("agent_success_rate", "agent_mean_turns", "agent_valid_tool_call_rate", "agent_reward_mean")
DONE = ("agent_done_done", "agent_done_max_turns", "agent_done_max_total_tokens")
INJECTED = "What is 2+3? <script>alert('x')</script>"


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("agent_eval")
    taught = teach_calculator(tiny_model_dir, root / "taught")
    barely = teach_calculator(tiny_model_dir, root / "barely", steps=2)
    rows = [{"prompt": [{"role": "user", "content": q}], "solution": a} for q, _, a in CALCULATOR_QUESTIONS]
    rows.append({"prompt": INJECTED, "solution": "5"})
    path = root / "held_out.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"taught": taught, "barely": barely, "rows": str(path)}


def _args(setup, out, *extra):
    return [
        "evaluate",
        f"models=base={setup['barely']},tuned={setup['taught']}",
        "candidate=tuned",
        "baseline=base",
        "humaneval.enabled=false",
        f"output_dir={out}",
        f"env.path={setup['rows']}",
        "env.class=tools",
        "env.tools=calculator",
        "env.max_turns=3",
        "env.max_total_tokens=400",
        "env.max_new_tokens=96",
        "batch_size=2",  # 3 rows: two batches
        *extra,
    ]


def test_evaluate_plays_held_out_episodes_into_metrics_report_and_gate(setup, tmp_path):
    out = tmp_path / "eval"
    rules = "gate.rules=agent_success_rate>=baseline+0.1,agent_valid_tool_call_rate>=0.5"
    assert main(_args(setup, out, rules)) == 0
    result = json.loads((out / "metrics.json").read_text())
    assert result["generation"]["engine"] == "torch"  # auto is torch with env.path
    assert result["data"]["agent"]["count"] == 3 and result["data"]["agent"]["class"] == "tools"
    for label in ("base", "tuned"):
        metrics = result["models"][label]
        rows = [json.loads(line) for line in (out / "per_problem" / f"{label}_agent.jsonl").read_text().splitlines()]
        assert len(rows) == 3 and all(r["messages"][0]["role"] == "user" for r in rows)
        assert all(0 <= metrics[k] <= 1 for k in (*DONE, "agent_success_rate", "agent_valid_tool_call_rate"))
        assert 1 <= metrics["agent_mean_turns"] <= 3 and 0 <= metrics["agent_reward_mean"] <= 1
        assert abs(sum(metrics[k] for k in DONE) - 1) < 1e-9
        assert metrics["agent_success_rate"] == pytest.approx(sum(r["success"] for r in rows) / 3)
        assert metrics["agent_mean_turns"] == pytest.approx(sum(r["turns"] for r in rows) / 3)
        assert metrics["agent_reward_mean"] == pytest.approx(sum(r["reward"] for r in rows) / 3)
        tried = sum(r["tool_calls"] + r["malformed_tool_calls"] for r in rows)
        valid = sum(r["tool_calls"] for r in rows) / tried if tried else 0.0
        assert metrics["agent_valid_tool_call_rate"] == pytest.approx(valid)
        for row in rows:
            assert row["turns"] == len(row["rewards"]) and row["done_reason"] in (
                "done",
                "max_turns",
                "max_total_tokens",
            )
            assert row["success"] == (row["done_reason"] == "done" and row["rewards"][-1] >= 1.0)
    tuned = [json.loads(line) for line in (out / "per_problem" / "tuned_agent.jsonl").read_text().splitlines()]
    # the taught model calls the calculator, reads its result and answers right
    assert tuned[0]["success"] and tuned[0]["turns"] == 2 and tuned[0]["tool_calls"] == 1
    assert "tool: 5" in tuned[0]["transcript"]
    gate = result["gate"]
    assert [r["rule"] for r in gate["rules"]] == rules.split("=", 1)[1].split(",")
    expected = result["models"]["tuned"]["agent_success_rate"] >= result["models"]["base"]["agent_success_rate"] + 0.1
    assert gate["rules"][0]["passed"] == expected and gate["passed"] == all(r["passed"] for r in gate["rules"])

    page = (out / "report.html").read_text()
    assert "Agent episodes (whole transcripts)" in page
    assert html.escape(tuned[0]["transcript"], quote=True) in page  # whole, not cut, and escaped
    assert "<script>alert(" not in page and "&lt;script&gt;alert(" in page
    assert "agent_success_rate" in (out / "summary.md").read_text()


def test_env_keys_and_engines_are_checked(setup, tmp_path):
    """One-line errors naming the key: env.class and env.path go together, the RL stages' env checks apply, and
    the engines that cannot play episodes (vLLM, the served ONNX model, ZeRO-3) are refused with env.path."""
    from trainer_lib.stages.lifecycle.evaluate import EvaluateConfig

    base = _args(setup, tmp_path / "x")[1:]
    cfg = load_config(EvaluateConfig, None, base)
    assert (cfg.env.class_, cfg.env.max_new_tokens, cfg.env.limit, cfg.env.success_reward) == ("tools", 96, 0, 1.0)
    no_env = [a for a in base if not a.startswith("env.")] + ["safety.path=s.jsonl"]
    for args, message in [
        ([a for a in base if a != "env.class=tools"], "env.class: required with env.path"),
        ([*no_env, "env.class=tools", "env.tools=calculator"], "env.path: required with env.class"),
        ([*base, "env.tools=abacus"], "env.tools: expected some of calculator, python, search"),
        ([*base, "env.max_new_tokens=0"], "env.max_new_tokens"),
        ([*base, "env.limit=-1"], "env.limit"),
        ([*base, "engine=vllm"], "engine: vllm is not supported with env.path"),
        ([*base, "placement=zero3"], "placement: zero3 is not supported with env.path"),
        ([*base, f"served.export_dir={tmp_path}"], "served.export_dir: .* is not supported with env.path"),
        ([*no_env, "gate.rules=agent_success_rate>=0.5"], "gate.rules"),  # no agent metrics without env.path
    ]:
        with pytest.raises(ConfigError, match=message) as raised:
            load_config(EvaluateConfig, None, args)
        assert "\n" not in str(raised.value)


def test_a_bad_environment_setting_fails_before_any_model_loads(setup, tmp_path, capsys):
    out = tmp_path / "eval"
    args = [a.replace(setup["taught"], str(tmp_path / "no_model")) for a in _args(setup, out)]
    assert main([*args, "env.settings.timeout_s=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: env.class: env.settings.timeout_s is not a setting of") and err.count("\n") == 1


@pytest.mark.distributed
@pytest.mark.extended
def test_two_ranks_play_the_one_process_episodes(setup, tmp_path):
    """--nproc 2: the rows' batches are shared out across the ranks and merged back in order; the episodes, the
    metrics and the gate are the one process's."""
    import subprocess
    import sys

    from tests.conftest import REPO, clean_env

    single, sharded = tmp_path / "one", tmp_path / "two"
    assert main(_args(setup, single)) == 0
    args = _args(setup, sharded)
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", args[0], "--nproc", "2", *args[1:]],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one, two = (json.loads((folder / "metrics.json").read_text()) for folder in (single, sharded))
    assert two["generation"]["ranks"] == 2 and two["models"] == one["models"] and two["gate"] == one["gate"]
    for label in ("base", "tuned"):
        name = f"{label}_agent.jsonl"
        assert (sharded / "per_problem" / name).read_text() == (single / "per_problem" / name).read_text()
