"""Tensor and pipeline parallelism (``parallel.tensor``: DeepSpeed AutoTP; ``parallel.pipeline``: its
pipeline engine) through ``posttrain sft --nproc``, real torchrun workers on CPU (gloo).

A T=2 and a P=2 run of SFT on the tiny Llama must follow the one-process run: the same loss, gradient
norm and eval loss at every step (rel 1e-5) and the same saved weights (abs 1e-4), within what a
different order of float32 sums gives (under T each rank computes half of every projection and the
halves are summed by an all-reduce; under P the clip norm is summed over the stages: ~1e-7 relative
per step, measured 8.5e-6 and 7.6e-6 max abs weight difference after 6 steps at lr 3e-3,
2026-12-02). Each resumes bit-exact after a SIGKILL. Layouts that cannot work exit 2 with one line
before any worker starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.engine.layout_runs import kill_when_held, metrics, run_stage, series, stage_command, weights
from tests.paused_cli import worker_env
from trainer_lib.cli import main
from trainer_lib.config.sections import ParallelConfig
from trainer_lib.engine.checkpoint import MARKER, tag_for
from trainer_lib.engine.parallel import Layout, check_model, layout
from trainer_lib.errors import ConfigError

ARGS = [
    "batch_size=1",
    "data.packing=false",
    "data.max_length=64",
    "lr=3e-3",
    "seed=1",
    "max_steps=6",
    "save_steps=2",
    "save_total_limit=2",
    "logging_steps=1",
    "eval_steps=3",
    "data.eval_fraction=0.2",
    "report_to=[none]",
]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, chat_jsonl, tmp_path_factory):
    """The same SFT run in one process and with parallel.tensor=2 on two workers."""
    tmp = tmp_path_factory.mktemp("tensor_parallel")
    argv = [f"model.path={tiny_model_dir}", f"data.path={chat_jsonl}", *ARGS]
    assert main(["sft", *argv, f"output_dir={tmp / 'one'}"]) == 0
    log = run_stage("sft", [*argv, "parallel.tensor=2", f"output_dir={tmp / 'tp'}"], worker_env(tmp))
    pipe_log = run_stage("sft", [*argv, "parallel.pipeline=2", f"output_dir={tmp / 'pp'}"], worker_env(tmp))
    return dict(argv=argv, tmp=tmp, one=tmp / "one", tp=tmp / "tp", pp=tmp / "pp", log=log, pipe_log=pipe_log)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "run, line",
    [
        ("tp", "parallel: tensor 2 x pipeline 1 x data 1 = 2 rank(s)"),
        ("pp", "parallel: tensor 1 x pipeline 2 x data 1 = 2 rank(s)"),
    ],
)
def test_two_model_parallel_ranks_follow_one_process(runs, run, line):
    """T=2 (each projection split) and P=2 (the two decoder layers on two stages) train as one process does."""
    assert line in runs["log" if run == "tp" else "pipe_log"]
    for key, split in (("loss", "train"), ("grad_norm", "train"), ("loss", "eval")):
        one, split_run = series(runs["one"], key, split), series(runs[run], key, split)
        assert len(one) == len(split_run) > 0, key
        assert one == pytest.approx(split_run, rel=1e-5), (key, split)
    assert series(runs["one"], "loss")[-1] < series(runs["one"], "loss")[0]  # it trained
    one, trained = weights(runs["one"]), weights(runs[run])
    assert one.keys() == trained.keys()
    for name in one:  # whole tensors, gathered from both ranks' shards or stages
        assert one[name].shape == trained[name].shape, name
        assert torch.allclose(one[name], trained[name], atol=1e-4, rtol=0), name


@pytest.mark.distributed
@pytest.mark.parametrize(
    "run, setting",
    [("tp", "parallel.tensor=2"), pytest.param("pp", "parallel.pipeline=2", marks=pytest.mark.extended)],
)
def test_a_killed_model_parallel_run_resumes_bit_exact(runs, run, setting):
    """Rank 1 held as it creates step 4's checkpoint directory, every worker SIGKILLed there; the
    rerun resumes from step 2 and ends equal to the uninterrupted run. (P=2 in make test-all: the
    pipeline engine's own save and load are checked bit-exact in test_pipeline_parallel.py.)"""
    tmp = runs["tmp"]
    out, ready = tmp / f"killed_{run}", tmp / f"held_{run}"
    argv = [*runs["argv"], setting, f"output_dir={out}"]
    env = worker_env(tmp, HOLD_RANK="1", HOLD_EVENT="mkdir", HOLD_PATTERN=tag_for(4) + "$", HOLD_READY=str(ready))
    kill_when_held(stage_command("sft", argv), env, ready)
    assert not (out / "summary.json").exists()
    assert (out / "checkpoints" / tag_for(2) / MARKER).exists()
    log = run_stage("sft", argv, worker_env(tmp))
    assert "resuming at step 2" in log
    reference, resumed = weights(runs[run]), weights(out)
    assert all(torch.equal(reference[name], resumed[name]) for name in reference)
    assert metrics(out) == metrics(runs[run])


@pytest.mark.distributed
@pytest.mark.extended
def test_tensor_and_data_parallel_on_four_ranks(runs):
    """T=2 x DP=2: each tensor group trains on its own rows; with one row per micro-batch that is the
    one-process run at gradient accumulation 2 (the same micro-batches, by the schedule's design)."""
    tmp = runs["tmp"]
    one, four = tmp / "one_accumulating", tmp / "four"
    argv = [*runs["argv"], "eval_steps=0", "save_steps=0"]
    assert main(["sft", *argv, "engine.gradient_accumulation_steps=2", f"output_dir={one}"]) == 0
    log = run_stage(
        "sft", [*argv, "parallel.tensor=2", "engine.zero_stage=2", f"output_dir={four}"], worker_env(tmp), nproc=4
    )
    assert "parallel: tensor 2 x pipeline 1 x data 2 = 4 rank(s)" in log
    assert series(one, "loss") == pytest.approx(series(four, "loss"), rel=1e-5)
    reference, trained = weights(one), weights(four)
    assert all(torch.allclose(reference[name], trained[name], atol=1e-4, rtol=0) for name in reference)


@pytest.mark.distributed
@pytest.mark.extended
def test_tensor_groups_inside_pipeline_stages_on_four_ranks(runs):
    """T=2 x P=2 (3D without data parallel): each stage's projections split over its two ranks with
    DeepSpeed's AutoTP layers inside the pipeline engine; the one-process run's numbers and weights,
    and a resume from its step-4 checkpoint that ends bit-exact."""
    import shutil

    tmp = runs["tmp"]
    out = tmp / "tp_pp"
    argv = [*runs["argv"], "parallel.tensor=2", "parallel.pipeline=2"]
    log = run_stage("sft", [*argv, f"output_dir={out}"], worker_env(tmp), nproc=4)
    assert "parallel: tensor 2 x pipeline 2 x data 1 = 4 rank(s)" in log
    for key, split in (("loss", "train"), ("grad_norm", "train"), ("loss", "eval")):
        assert series(runs["one"], key, split) == pytest.approx(series(out, key, split), rel=1e-5), (key, split)
    reference, trained = weights(runs["one"]), weights(out)
    assert all(torch.allclose(reference[name], trained[name], atol=1e-4, rtol=0) for name in reference)
    # a rerun from step 4's checkpoint (the later one gone, as if killed before it) ends where this run did
    resumed = tmp / "tp_pp_resumed"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoints" / tag_for(6))
    (resumed / "summary.json").unlink()
    assert "resuming at step 4" in run_stage("sft", [*argv, f"output_dir={resumed}"], worker_env(tmp), nproc=4)
    final = weights(resumed)
    assert all(torch.equal(trained[name], final[name]) for name in trained)


@pytest.mark.parametrize(
    "args, nproc, keys",
    [
        (["parallel.tensor=3"], 3, "parallel.tensor=3 does not divide the llama model's num_attention_heads (4)"),
        (["parallel.tensor=2"], 3, "parallel.tensor=2 x parallel.pipeline=1 = 2 does not divide the world size 3"),
        (["parallel.pipeline=3"], 3, "parallel.pipeline=3 does not divide the llama model's num_hidden_layers (2)"),
        (["parallel.pipeline=2", "engine.zero_stage=3"], 2, "parallel.pipeline=2 with engine.zero_stage=3"),
        (["parallel.tensor=2", "parallel.pipeline=2"], 6, "parallel.tensor=2 x parallel.pipeline=2 = 4 does not"),
        (["parallel.tensor=2", "lora.r=4"], 2, "parallel.tensor=2 with lora.r=4"),
    ],
)
def test_a_layout_that_cannot_work_exits_2_in_one_line(tiny_model_dir, chat_jsonl, tmp_path, capsys, args, nproc, keys):
    argv = ["sft", f"model.path={tiny_model_dir}", f"data.path={chat_jsonl}", f"output_dir={tmp_path / 'out'}"]
    assert main([*argv, *args, "--nproc", str(nproc)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: " + keys) and "\n" not in err
    assert not (tmp_path / "out").exists()  # no worker started, nothing written


def test_rl_stages_refuse_model_parallelism(tiny_model_dir, tmp_path, capsys):
    argv = [f"model.path={tiny_model_dir}", f"data.path={tmp_path}/p.jsonl", f"output_dir={tmp_path}/o"]
    assert main(["online-dpo", *argv, "reward.functions=[length]", "parallel.tensor=2"]) == 2
    assert "parallel.tensor=2: this stage runs data parallelism only" in capsys.readouterr().err
    assert main(["ppo", *argv, "reward.functions=[length]", "parallel.tensor=2"]) == 2
    assert "parallel.tensor=2: this stage takes parallel.sequence besides data parallelism" in capsys.readouterr().err


def test_layout_follows_deepspeeds_rank_order():
    # AutoTP's mesh is (data, tensor): ranks 0,1 are one tensor group and read data shard 0
    assert [Layout(tensor=2, world=4).data_rank(r) for r in range(4)] == [0, 0, 1, 1]
    # the pipeline topology is (pipe, data): ranks 0,1 are stage 0 of data shards 0 and 1
    assert [Layout(pipeline=2, world=4).data_rank(r) for r in range(4)] == [0, 1, 0, 1]
    # tensor groups inside pipeline stages: (pipe, data, model), model innermost
    assert [Layout(tensor=2, pipeline=2, world=8).data_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert Layout(tensor=2, world=8).data == 4 and Layout(world=3).data_rank(2) == 2
    with pytest.raises(ConfigError, match="does not divide the world size 6"):
        layout(ParallelConfig(tensor=4), 6)


def test_model_checks_name_the_key_and_read_nested_text_configs():
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        check_model(ParallelConfig(tensor=4), {"num_attention_heads": 8, "num_key_value_heads": 2})
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        check_model(ParallelConfig(pipeline=2), {"text_config": {"num_hidden_layers": 3, "model_type": "qwen2"}})
    check_model(ParallelConfig(tensor=2, pipeline=1), {"num_attention_heads": 4, "num_key_value_heads": 2})


@pytest.mark.distributed
@pytest.mark.parametrize(
    "stage, setting",
    [
        pytest.param("dpo", "parallel.tensor=2", marks=pytest.mark.extended),
        pytest.param("reward", "parallel.tensor=2", marks=pytest.mark.extended),
        ("dpo", "parallel.pipeline=2"),
    ],
)
def test_preference_stages_follow_one_process(stage, setting, tiny_model_dir, tmp_path):
    """DPO under T=2 (log-probs through the replicated LM head, a reference model sharded like the policy)
    and under P=2 (the last stage turns logits into sequence log-probs; the reference precomputed through
    the pipeline first), and the reward model (its score head) under T=2 give the one-process losses,
    metrics and weights. The one-process DPO precomputes its reference too, as P=2 always does."""
    rows = [("Is the sky green?", "No, it is blue.", "Yes."), ("What is 2+2?", "4", "5"), ("Say hi", "Hi!", "Bye.")]
    data = tmp_path / "pairs.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": p + " " * i, "chosen": c, "rejected": r}) + "\n" for i in range(4) for p, c, r in rows
        )
    )
    argv = [stage, f"model.path={tiny_model_dir}", f"data.path={data}", "max_steps=4", "batch_size=2", "lr=1e-3"]
    argv += ["logging_steps=1", "eval_steps=2", "save_steps=0", "data.eval_fraction=0.25", "report_to=[none]"]
    argv += ["reference=precomputed"] if stage == "dpo" else []
    assert main([*argv, f"output_dir={tmp_path / 'one'}"]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", *argv, setting, "--nproc", "2", f"output_dir={tmp_path}/split"],
        cwd=REPO,
        env=worker_env(tmp_path),
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    keys = ("loss", "rewards/accuracy", "rewards/margins", "logps/chosen", "accuracy", "grad_norm")
    for split in ("train", "eval"):
        for key in keys:
            one, split_run = series(tmp_path / "one", key, split), series(tmp_path / "split", key, split)
            assert one == pytest.approx(split_run, rel=1e-4, abs=1e-6), (key, split)
    assert len(series(tmp_path / "one", "loss")) == 4
    reference, trained = weights(tmp_path / "one"), weights(tmp_path / "split")
    assert all(torch.allclose(reference[name], trained[name], atol=1e-4, rtol=0) for name in reference)


@pytest.mark.parametrize(
    "name, shape",
    [("sft-llama-3-70b-tp8.yaml", (8, 1, 2)), ("sft-llama-3-70b-tp8-pp2.yaml", (8, 2, 1))],
)
def test_the_70b_examples_cut_llama_3_70b_on_two_nodes(capsys, name, shape):
    """The 70B examples on 2 nodes x 8 GPUs: tensor 8 x data 2, or tensor 8 x pipeline 2; whole heads on
    every rank and stages of equal depth (Llama-3-70B's config: 64 heads, 8 KV heads, 80 layers)."""
    import yaml

    assert main(["sft", "--config", os.path.join(REPO, "examples", name), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    parallel = ParallelConfig(**printed["parallel"])
    found = layout(parallel, 16)
    assert (found.tensor, found.pipeline, found.data) == shape
    check_model(parallel, {"num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80})


@pytest.mark.distributed
def test_a_checkpoint_resumes_only_under_its_own_layout(runs, tmp_path, capsys):
    """The T=2 run's checkpoints hold half-projections: a one-process rerun is refused, naming the layout."""
    import shutil

    copy = tmp_path / "tp"
    shutil.copytree(runs["tp"], copy)
    (copy / "summary.json").unlink()  # not finished: the rerun would resume
    assert main(["sft", *runs["argv"], f"output_dir={copy}"]) == 2
    err = capsys.readouterr().err
    assert "saved with parallel.tensor=2 parallel.pipeline=1, this run has parallel.tensor=1" in err


@pytest.mark.parametrize(
    "args, why",
    [
        (["loss=kto"], "not with loss=kto"),
        (["beta_alpha=0.5"], "not with beta-DPO"),
        (["reference=model"], "not with a reference other than the starting model"),
        (["reference_model_path=/elsewhere"], "not with a reference other than the starting model"),
    ],
)
def test_dpo_under_a_pipeline_refuses_what_it_cannot_run(tiny_model_dir, tmp_path, capsys, args, why):
    argv = ["dpo", f"model.path={tiny_model_dir}", f"data.path={tmp_path}/p.jsonl", f"output_dir={tmp_path}/o"]
    assert main([*argv, "parallel.pipeline=2", *args]) == 2
    assert f"parallel.pipeline=2: {why}" in capsys.readouterr().err


@pytest.mark.distributed
@pytest.mark.extended
@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_tensor_parallel_follows_one_process_for_other_families(family, tiny_model_dir, chat_jsonl, tmp_path):
    """AutoTP on Qwen2 (biased q/k/v projections, tied head) and Mistral (untied head) as on Llama."""
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    shape = dict(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    shape.update(num_key_value_heads=2, intermediate_size=128, pad_token_id=tokenizer.pad_token_id)
    config, model_class = {
        "qwen2": (Qwen2Config(**shape, tie_word_embeddings=True), Qwen2ForCausalLM),
        "mistral": (MistralConfig(**shape, tie_word_embeddings=False), MistralForCausalLM),
    }[family]
    torch.manual_seed(0)
    model_class(config).save_pretrained(tmp_path / family)
    tokenizer.save_pretrained(tmp_path / family)
    argv = [f"model.path={tmp_path / family}", f"data.path={chat_jsonl}", *ARGS, "eval_steps=0", "save_steps=0"]
    assert main(["sft", *argv, f"output_dir={tmp_path / 'one'}"]) == 0
    run_stage("sft", [*argv, "parallel.tensor=2", f"output_dir={tmp_path / 'tp'}"], worker_env(tmp_path))
    assert series(tmp_path / "one", "loss") == pytest.approx(series(tmp_path / "tp", "loss"), rel=1e-5)
    reference, trained = weights(tmp_path / "one"), weights(tmp_path / "tp")
    assert all(torch.allclose(reference[name], trained[name], atol=1e-4, rtol=0) for name in reference)
