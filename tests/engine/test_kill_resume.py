"""Every training stage survives SIGKILL and ends, rerun with the same command, bit-exact.

Each case starts the stage as a real ``posttrain`` process (through :mod:`tests.paused_cli`, which
holds it at an exact point of its own file I/O), kills it there with SIGKILL, reruns the same
command until it finishes, and compares with an uninterrupted run of the same seed: the final
weights (max abs diff 0), every logged metric except wall-clock ones, the summary, and the state
the stage keeps beside the weights (running reward statistics, the KL controller, the critic).
Kill points: before the first checkpoint, between checkpoints, after a checkpoint's files but
before its COMPLETE marker (locally, and on S3 where the retry is a fresh pod: new output_dir,
empty cache), and while the final model is being moved into place. Six steps, a checkpoint
every two, the last two kept.

Preemption: the same points take SIGTERM instead (the process is held there, signalled, then let
go): right after a checkpoint's files (its marker being written), in the middle of another
checkpoint's save, and in the middle of a step between checkpoints (held inside its reward
function). Each time the stage must stop at the end of that step with a complete checkpoint of it
and exit status 75, and the rerun resume from that step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import CHAT_ROWS, REPO, clean_env, repeatable
from tests.rl.agent_helpers import AGENT_GRPO, teach_calculator, write_calculator_questions
from tests.stages.training.rl_helpers import LENGTH_REWARD, one_thread, write_prompts, write_reward_adapter
from trainer_lib.cli import main
from trainer_lib.engine.checkpoint import MARKER, tag_for
from trainer_lib.engine.preemption import PREEMPTED_EXIT

COMMON = ["max_steps=6", "save_steps=2", "save_total_limit=2", "logging_steps=1"]
RL = [
    f"reward.functions={LENGTH_REWARD}",
    "rollout.n=4",
    "prompts_per_step=4",
    "rollout.max_new_tokens=8",
    "batch_size=8",
    "data.eval_fraction=0",
    "reward.normalize=running",
    "lr=1e-2",
]


@dataclasses.dataclass
class Kill:
    event: str  # tests.paused_cli: mkdir | rename | open | audit
    pattern: str  # regular expression on the path ({out}: the output directory)
    resumes_at: int  # the step the next run must resume from
    signal: int = signal.SIGKILL  # SIGTERM: held, signalled, let go; it must stop with status 75


BEFORE_FIRST = Kill("mkdir", tag_for(2) + "$", 0)
BETWEEN = Kill("mkdir", tag_for(4) + "$", 2)
UNMARKED = Kill("rename", f"{tag_for(4)}/{MARKER}$", 2)
FINAL_MODEL = Kill("rename", r"{out}/model\.safetensors$", 6)
TERM_AFTER_CHECKPOINT = Kill("rename", f"{tag_for(2)}/{MARKER}$", 2, signal.SIGTERM)
TERM_DURING_SAVE = Kill("open", f"{tag_for(4)}/metrics\\.jsonl$", 4, signal.SIGTERM)  # after the engine's files
TERM_MID_STEP = Kill("audit", "^3$", 3, signal.SIGTERM)  # in step 3's reward function (tests/engine/held_reward.py)
HELD_REWARD = os.path.join(REPO, "tests", "engine", "held_reward.py") + ":reward"


@dataclasses.dataclass
class Case:
    stage: str
    args: list[str]  # with {model}, {chat}, {pairs}, {prompts}, {feedback} placeholders
    kills: list[Kill]
    s3: bool = False  # checkpoint_dir on the S3 server; every rerun is a fresh pod
    overrides: tuple[str, ...] = ()  # after COMMON


CASES = {
    "sft": Case(
        "sft",
        [
            "model.path={model}",
            "data.path={chat}",
            "batch_size=2",
            "data.max_length=64",
            "data.packing=false",
            "lr=3e-3",
            "seed=1",
        ],
        [BEFORE_FIRST, TERM_AFTER_CHECKPOINT, UNMARKED, TERM_DURING_SAVE, FINAL_MODEL],
    ),
    "reward": Case(
        "reward",
        ["model.path={model}", "data.path={pairs}", "batch_size=4", "data.max_length=64", "lr=2e-3", "seed=2"],
        [BETWEEN],
    ),
    "dpo": Case(
        "dpo",
        [
            "model.path={model}",
            "data.path={pairs}",
            "batch_size=4",
            "data.max_length=64",
            "lr=1e-3",
            "reference=precomputed",
            "seed=4",
        ],
        [UNMARKED],
    ),
    "dpo_beta": Case(  # beta-DPO: its running margin statistics and filter draws must resume too
        "dpo",
        [
            "model.path={model}",
            "data.path={pairs}",
            "batch_size=4",
            "data.max_length=64",
            "lr=1e-3",
            "beta_alpha=1.0",
            "beta_filter=0.25",
            "beta_momentum=0.5",
            "seed=7",
        ],
        [BETWEEN],
    ),
    "ppo": Case(
        "ppo",
        [
            "model.path={model}",
            "data.path={prompts}",
            *RL,
            "kl.adaptive=true",
            "kl.target=0.5",
            "kl.horizon=50",
            "mini_batch_size=8",
            "ppo_epochs=2",
            "seed=5",
        ],
        [BETWEEN],
    ),
    "ppo_nlpo": Case(  # the masking policy (copied at step 0, refreshed at 3) is restored from step 2's checkpoint
        "ppo",
        [
            "model.path={model}",
            "data.path={prompts}",
            *RL,
            "objective=nlpo",
            "nlpo.top_p=0.7",
            "nlpo.mask_update_steps=3",
            "ppo_epochs=2",
            "seed=9",
        ],
        [BETWEEN],
    ),
    "grpo": Case("grpo", ["model.path={model}", "data.path={prompts}", *RL, "seed=3"], [UNMARKED]),
    "ppo_multi_adapter": Case(  # one frozen base: policy, value and reward adapters and the value head
        "ppo",
        [
            "model.path={model}",
            "data.path={prompts}",
            *RL,
            "multi_adapter=true",
            "lora.r=4",
            "lora.alpha=8",
            "reward.model_path={reward_adapter}",
            "reward.weights=1,0.1",
            "ppo_epochs=2",
            "mini_batch_size=8",
            "seed=10",
        ],
        [BETWEEN],
    ),
    "grpo_multi_adapter": Case(  # policy and reward adapters on one frozen base; SIGTERM in step 3, off the
        "grpo",  # save schedule and between two log records (its unlogged metric sums are checkpointed too)
        [
            "model.path={model}",
            "data.path={prompts}",
            *RL,
            f"reward.functions={HELD_REWARD}",
            "multi_adapter=true",
            "lora.r=4",
            "lora.alpha=8",
            "reward.model_path={reward_adapter}",
            "reward.weights=1,0.1",
            "seed=11",
        ],
        [TERM_MID_STEP],
        overrides=("logging_steps=4",),
    ),
    "grpo_agent": Case(  # multi-turn episodes with the calculator (deterministic tools): SIGKILL between checkpoints
        "grpo",
        [
            "model.path={calculator_model}",
            "data.path={questions}",
            *AGENT_GRPO,
        ],
        [BETWEEN],
    ),
    "grpo_rloo_s3": Case(
        "grpo",
        [
            "model.path={model}",
            "data.path={prompts}",
            *RL,
            "advantage=rloo",
            "lora.r=4",
            "lora.alpha=8",
            "ppo_epochs=2",
            "mini_batch_size=8",
            "seed=6",
        ],
        [UNMARKED],
        s3=True,
    ),
}


@pytest.fixture(scope="module")
def inputs(tiny_model_dir, chat_jsonl, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("kill")
    pairs = root / "pairs.jsonl"
    with open(pairs, "w", encoding="utf-8") as fh:
        for i, (question, answer) in enumerate(CHAT_ROWS):
            for j, (_, other) in enumerate(CHAT_ROWS):
                if i != j:
                    fh.write(json.dumps({"prompt": question, "chosen": answer, "rejected": other}) + "\n")
    (root / "feedback").mkdir()  # its file repeats the 24 prompts and adds 6
    return {
        "model": tiny_model_dir,
        "chat": chat_jsonl,
        "pairs": str(pairs),
        "prompts": write_prompts(root / "prompts.jsonl"),
        "feedback": os.path.dirname(write_prompts(root / "feedback" / "new.jsonl", count=30)),
        "reward_adapter": write_reward_adapter(tiny_model_dir, root / "reward_adapter"),
    }


@pytest.fixture(scope="module")
def agent_inputs(tiny_model_dir, tmp_path_factory) -> dict:
    """The multi-turn case's: a tiny model taught to call the calculator, and its questions."""
    root = tmp_path_factory.mktemp("kill-agent")
    questions = write_calculator_questions(root / "questions.jsonl")
    with one_thread():
        model = teach_calculator(tiny_model_dir, root / "calculator")
    return {"calculator_model": model, "questions": questions}


def _env(cache: str) -> dict:
    """One intra-op thread, as the in-process reference runs (other thread counts round differently)."""
    env = clean_env()
    env.update(
        OMP_NUM_THREADS="1",
        POSTTRAIN_CACHE=cache,
        PYTHONPATH=os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p),
    )
    return env


def _kill_at(argv: list[str], kill: Kill, out: str, env: dict, workdir) -> str:
    """Start the stage, wait until it is held at ``kill``'s point, SIGKILL it (or send SIGTERM and let it
    go on: it must then stop with status 75 within a minute); its output."""
    ready, log = workdir / "held", workdir / "killed.log"
    if ready.exists():
        ready.unlink()
    pattern = kill.pattern.replace("{out}", re.escape(out.rstrip("/")))
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.paused_cli", kill.event, pattern, str(ready), "--", *argv],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"never reached {kill} (exit {proc.poll()}):\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.02)
        os.kill(proc.pid, kill.signal)
        if kill.signal == signal.SIGTERM:
            ready.unlink()  # let it go on
            proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    output = log.read_text(errors="replace")
    if kill.signal == signal.SIGTERM:
        assert proc.returncode == PREEMPTED_EXIT, output[-3000:]
        last = output.strip().splitlines()[-1]
        assert last.startswith("preempted: ") and f"stopped after step {kill.resumes_at} of 6" in last, last
    else:
        assert proc.returncode == -signal.SIGKILL
    return output


def _rerun(argv: list[str], env: dict) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", *argv],
        cwd=REPO,
        env=env,
        timeout=300,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    return done.stdout


def _weights(out) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(out, "model.safetensors"))


def _records(out) -> list[dict]:
    """metrics.jsonl without wall-clock values."""
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8")]
    return [repeatable(r) for r in records]


def _final_state(ckpt_dir: str, stage: str) -> dict:
    """What the last checkpoint keeps beside the weights: client state, and PPO's critic."""
    tag = os.path.join(ckpt_dir, tag_for(6))
    state = torch.load(os.path.join(tag, "mp_rank_00_model_states.pt"), weights_only=False)
    kept = {k: state[k] for k in ("step", "rewards", "kl_controller", "dynamic_beta", "prompt_buffer") if k in state}
    if os.path.isdir(os.path.join(tag, "critic")):  # PPO's critic engine (multi_adapter: inside the one engine)
        kept["critic"] = torch.load(os.path.join(tag, "critic", "mp_rank_00_model_states.pt"), weights_only=False)[
            "module"
        ]
    return kept


def _summary(out) -> dict:
    """summary.json without what differs by design (DPO's rerun loads the reference table it stored)."""
    summary = json.loads(open(os.path.join(out, "summary.json"), encoding="utf-8").read())
    for key in ("output_dir", "reference_logps"):
        summary.pop(key, None)
    return summary


def _assert_same(a, b, path="") -> None:
    if isinstance(a, torch.Tensor):
        if not torch.equal(a, b):
            pytest.fail(f"{path}: max abs diff {float((a.float() - b.float()).abs().max())}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_same(a[key], b[key], f"{path}.{key}")
    else:
        assert a == b, f"{path}: {a} != {b}"


# reward, DPO and plain GRPO share the cadence and checkpoint code SFT, PPO and GRPO-on-S3 exercise:
# they run in `make test-all` only (the CI budget). The cases with state of their own (beta-DPO's running
# margin, NLPO's masking policy, the prompt pool and its feedback files, multi-adapter GRPO with its SIGTERM)
# run in `make test` (11-12 s each); multi-adapter PPO (its value adapter and head) and GRPO on multi-turn
# episodes (its rollouts go through the same cadence; the calculator is deterministic) in `make test-all`.
EXTENDED = ("reward", "dpo", "grpo", "ppo_multi_adapter", "grpo_agent")


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.extended) if n in EXTENDED else n for n in CASES])
def test_killed_stage_resumes_bit_exact(name, inputs, tmp_path, request):
    from trainer_lib import storage

    case = CASES[name]
    if any("{calculator_model}" in a for a in case.args):
        inputs = {**inputs, **request.getfixturevalue("agent_inputs")}
    argv = [case.stage, *(a.format(**inputs) for a in case.args), *COMMON, *case.overrides]
    reference = str(tmp_path / "reference")
    with one_thread():
        assert main([*argv, f"output_dir={reference}"]) == 0

    ckpt_args, ckpt_root = [], str(tmp_path / "run" / "checkpoints")
    if case.s3:
        ckpt_root = f"s3://{request.getfixturevalue('s3_bucket')}/checkpoints/{name}"
        ckpt_args = [f"checkpoint_dir={ckpt_root}"]
    resumes_at = 0
    for attempt, kill in enumerate([*case.kills, None]):
        # on S3 every attempt is a fresh pod (new output_dir, empty cache); locally the same directory
        out = str(tmp_path / (f"pod{attempt}" if case.s3 else "run"))
        env = _env(str(tmp_path / (f"cache{attempt}" if case.s3 else "cache")))
        command = [*argv, f"output_dir={out}", *ckpt_args]
        output = _rerun(command, env) if kill is None else _kill_at(command, kill, out, env, tmp_path)
        resumed = re.search(r"resuming at step (\d+)", output)
        assert (int(resumed.group(1)) if resumed else 0) == resumes_at, output[-3000:]
        if kill is not None:
            resumes_at = kill.resumes_at
            assert not os.path.exists(os.path.join(out, "summary.json"))  # nothing that looks finished
        if kill is not None and kill.signal == signal.SIGTERM:  # the step it stopped at, complete
            assert storage.exists(storage.join(ckpt_root, tag_for(kill.resumes_at), MARKER))
        if kill is UNMARKED:  # every file of step 4 written (uploaded), its marker not
            assert storage.exists(storage.join(ckpt_root, tag_for(4), "mp_rank_00_model_states.pt"))
            assert not storage.exists(storage.join(ckpt_root, tag_for(4), MARKER))

    _assert_same(_weights(reference), _weights(out))
    assert _records(out) == _records(reference)
    if "env.class=tools" in argv:  # the episodes called the tool and were rewarded: a multi-turn run that learns
        logged = _records(reference)
        assert any(r.get("episode/tool_calls", 0) > 0 for r in logged) and any(r.get("reward", 0) > 0 for r in logged)
    assert _summary(out) == _summary(reference)
    final = ckpt_root
    if case.s3:
        final = str(tmp_path / "downloaded")
        storage.download_dir(storage.join(ckpt_root, tag_for(6)), os.path.join(final, tag_for(6)))
    _assert_same(_final_state(os.path.join(reference, "checkpoints"), case.stage), _final_state(final, case.stage))
    # keep-last-K: the two newest checkpoints, complete, and nothing else (no half-written leftovers)
    assert storage.listdir(ckpt_root) == [tag_for(4), tag_for(6)]
    assert all(storage.exists(storage.join(ckpt_root, tag, MARKER)) for tag in (tag_for(4), tag_for(6)))
