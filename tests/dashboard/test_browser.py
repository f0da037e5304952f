"""The dashboard in a real browser (Debian's chromium, driven by Playwright): the charts hold the logged values,
samples are visible and inert, a failed gate names its rule, runs compare, a live run updates without a
reload, and an S3 prefix loads. Screenshots go to $POSTTRAIN_DASHBOARD_SHOTS when it is set (docs/dashboard.md)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env
from tests.dashboard.conftest import INJECTED, grpo_args, write_prompts

CHROMIUM = os.environ.get("POSTTRAIN_CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (make browser)")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    errors = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    context.close()
    assert not errors, errors  # no script error on any page, Plotly's included (under the page's CSP)


def wait_until(page, expression: str, timeout: float = 30.0) -> None:
    """Poll ``expression`` in the page until it is true (Playwright's wait_for_function compiles its predicate
    with eval, which the dashboard's Content-Security-Policy forbids, as it should)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"not true within {timeout} s: {expression}"
        time.sleep(0.1)


def open_view(page, url: str) -> None:
    """Go to ``url`` and wait until its view is drawn (a change of the #fragment alone does not reload the page:
    the view marks the body with the fragment it drew)."""
    fragment = "#" + url.split("#", 1)[1] if "#" in url else "#/"
    page.goto(url)
    wait_until(
        page, f"document.body.dataset.ready === {json.dumps(fragment)} || document.body.dataset.ready === 'error'"
    )
    assert page.locator("#error").count() == 0, page.inner_text("#error")


def shot(page, name: str) -> None:
    folder = os.environ.get("POSTTRAIN_DASHBOARD_SHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)


def chart_values(page, metric: str, trace: int = 0) -> list:
    return page.evaluate(f"document.querySelector('[data-metric=\"{metric}\"]').data[{trace}].y")


def test_a_finished_run_shows_its_curves_samples_and_list(page, dashboard_runs, dashboard):
    server = dashboard("--runs", str(dashboard_runs))
    open_view(page, server.url)
    rows = page.locator("#runs tbody tr")
    assert rows.count() == 4
    assert page.locator('tr[data-run="0/pipeline-b/broken"] [data-status]').inner_text() == "stale"
    assert page.locator('tr[data-run="0/pipeline-a/grpo"] [data-status]').inner_text() == "finished"
    page.select_option("#pipeline-filter", "pipeline-b")
    assert rows.count() == 1
    shot(page, "runs")

    open_view(page, server.url + "#/run/" + "0%2Fpipeline-a%2Fgrpo")
    logged = [json.loads(line) for line in open(dashboard_runs / "pipeline-a" / "grpo" / "metrics.jsonl")]
    train = [r for r in logged if r["split"] == "train"]
    assert chart_values(page, "reward") == [r["reward"] for r in train]  # the logged values, unsmoothed
    for metric in ("loss", "kl", "entropy", "clip_fraction", "response_length", "lr", "grad_norm", "memory_gb"):
        assert page.locator(f'[data-metric="{metric}"]').count() == 1, metric
    page.fill("#smoothing", "0.9")
    page.dispatch_event("#smoothing", "input")
    smoothed = chart_values(page, "reward")
    assert smoothed[0] == pytest.approx(train[0]["reward"]) and smoothed != [r["reward"] for r in train]

    cards = page.locator("#sample-list .sample")
    assert cards.count() == 32
    assert page.locator("#sample-list pre.completion").first.inner_text().strip() != ""
    # a prompt holding HTML shows as its text, and runs nothing
    assert INJECTED in page.inner_text("#sample-list")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#sample-list img, #sample-list script").count() == 0
    page.select_option("#sample-step", "4")
    wait_until(page, "document.querySelectorAll('#sample-list .sample').length === 8")
    assert all(text.startswith("step 4 ") for text in page.locator("#sample-list .meta").all_inner_texts())
    shot(page, "run-grpo")


def test_a_failed_gate_names_its_rule_and_runs_compare(page, dashboard_runs, dashboard):
    server = dashboard("--runs", str(dashboard_runs))
    open_view(page, server.url + "#/run/" + "0%2Fpipeline-a%2Fevaluate")
    assert "FAILED" in page.inner_text("#gate-verdict")
    rule = page.locator('#gate-rules tr[data-rule="task_pass_rate>=baseline+0.5"]')
    assert rule.get_attribute("data-passed") == "false" and "FAILED" in rule.inner_text()
    assert page.locator('#eval-metrics tr[data-model="tuned"]').count() == 1
    assert page.locator("#per-problem tbody tr").count() == 2  # the two tasks, with what the model wrote
    shot(page, "evaluation")

    open_view(page, server.url)
    page.check('input[data-run="0/pipeline-a/grpo"]')
    page.check('input[data-run="0/pipeline-a/grpo-lr"]')
    page.click("#compare-button")
    wait_until(page, "document.querySelector('[data-metric=\"reward\"]') !== null")
    assert page.evaluate("document.querySelector('[data-metric=\"reward\"]').data.length") == 2
    second = [json.loads(line) for line in open(dashboard_runs / "pipeline-a" / "grpo-lr" / "metrics.jsonl")]
    assert chart_values(page, "reward", 1) == [r["reward"] for r in second if r["split"] == "train"]
    assert page.locator('tr[data-key="lr"]').count() == 1 and page.locator('tr[data-key="seed"]').count() == 0
    page.select_option("#x-axis", "tokens")
    xs = page.evaluate("document.querySelector('[data-metric=\"reward\"]').data[1].x")
    assert xs == [sum(r["tokens"] for r in second[: i + 1]) for i in range(len(second))]
    shot(page, "compare")

    open_view(page, server.url + "#/run/" + "0%2Fpipeline-b%2Fbroken")
    problems = page.inner_text("[data-problems]")
    assert "metrics.jsonl: line 4" in problems and "step-00000002: no COMPLETE marker" in problems
    assert chart_values(page, "loss") == [2.0, 1.0, 2.0 / 3]  # what could be read is still drawn


@pytest.mark.extended  # (a GRPO process trained while the page watches: ~25 s; make test-all)
def test_a_running_stage_updates_without_a_reload_and_goes_stale_when_killed(page, tiny_model_dir, dashboard, tmp_path):
    root = tmp_path / "runs"
    out = root / "live"
    args = grpo_args(tiny_model_dir, write_prompts(tmp_path / "prompts.jsonl"), out, "max_steps=100000")
    env = {**clean_env(), "POSTTRAIN_HEARTBEAT_S": "0.5", "OMP_NUM_THREADS": "1", "POSTTRAIN_NO_PROGRESS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer_lib.cli", *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        server = dashboard("--runs", str(root))
        open_view(page, server.url + "#/run/0%2Flive")
        assert page.inner_text("#run-status") == "running"
        first = page.evaluate("document.querySelector('[data-metric=\"reward\"]').data[0].y.length")
        wait_until(page, f"document.querySelector('[data-metric=\"reward\"]').data[0].y.length > {first} + 2", 60)
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # the same page, no reload
        shot(page, "live")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_until(page, "document.querySelector('#run-status').innerText.trim() === 'stale'")


@pytest.mark.extended  # (tests/dashboard/test_web.py reads an S3 prefix in make test)
def test_an_s3_prefix_loads_in_the_browser(page, dashboard_runs, dashboard, s3_bucket, s3_server):
    from trainer_lib import storage

    storage.upload_dir(str(dashboard_runs / "pipeline-a"), f"s3://{s3_bucket}/runs/pipeline-a")
    server = dashboard("--runs", f"s3://{s3_bucket}/runs", env={"AWS_ENDPOINT_URL": s3_server.endpoint_url})
    open_view(page, server.url)
    assert page.locator("#runs tbody tr").count() == 3
    open_view(page, server.url + "#/run/0%2Fpipeline-a%2Fgrpo")
    logged = [json.loads(line) for line in open(dashboard_runs / "pipeline-a" / "grpo" / "metrics.jsonl")]
    assert chart_values(page, "reward") == [r["reward"] for r in logged if r["split"] == "train"]
    assert page.locator("#sample-list .sample").count() == 32


def test_an_agent_runs_samples_show_each_episodes_transcript(page, dashboard, tiny_model_dir, tmp_path):
    """GRPO in the calculator's ToolEnvironment (one step): each sample shows its whole episode, the tool's
    result between the model's turns, with its turns, end and tool calls."""
    from tests.rl.agent_helpers import teach_calculator, write_calculator_questions
    from tests.stages.training.rl_helpers import one_thread
    from tests.stages.training.test_grpo_episodes import agent_grpo

    questions = write_calculator_questions(tmp_path / "questions.jsonl")
    with one_thread():
        model = teach_calculator(tiny_model_dir, tmp_path / "calculator")
        agent_grpo(model, questions, tmp_path / "runs" / "agent", "max_steps=1", "save_steps=0")
    logged = [json.loads(line) for line in open(tmp_path / "runs" / "agent" / "samples.jsonl")]
    server = dashboard("--runs", str(tmp_path / "runs"))
    open_view(page, server.url + "#/run/" + "0%2Fagent")
    transcripts = page.locator("#sample-list pre.transcript")
    assert transcripts.count() == len(logged) == 8
    for row, text, meta in zip(logged, transcripts.all_inner_texts(), page.locator(".episode .meta").all_inner_texts()):
        assert text.strip() == row["episode"]["transcript"].strip()
        episode = row["episode"]
        assert meta.startswith(f"{episode['turns']} turns · ended: {episode['done_reason']}")
        assert meta.endswith(
            f"{episode['tool_calls']} tool calls, {episode['malformed_tool_calls']} malformed, "
            f"{episode['tool_errors']} failed"
        )
    assert any("tool:" in text for text in transcripts.all_inner_texts())  # a calculator result between turns
    shot(page, "agent-samples")
