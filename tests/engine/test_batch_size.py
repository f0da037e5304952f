"""batch_size=auto: the halving search, the host-memory measurement, and real runs that choose a size."""

import functools
import json

import pytest
import torch

from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.engine.batch_size import (
    OutOfHostMemory,
    Probe,
    _peak_rss_growth,
    candidates,
    host_fits,
    largest_fitting,
    rows_per_step,
)
from trainer_lib.errors import ConfigError
from trainer_lib.stages.training.grpo import GRPOConfig
from trainer_lib.stages.training.sft import SFTConfig

REQUIRED = ["model.path=m", "data.path=d", "output_dir=o"]


def test_candidates_halve_through_divisors_of_the_step():
    assert candidates(8) == [8, 4, 2, 1]
    assert candidates(12) == [12, 6, 3, 1]
    assert candidates(7) == [7, 1]
    assert candidates(1) == [1]


class FakeDevice:
    """A callable that runs out of memory the way CUDA does, above ``capacity`` rows."""

    def __init__(self, capacity: int):
        self.capacity, self.tried = capacity, []

    def __call__(self, rows: int) -> None:
        self.tried.append(rows)
        if rows > self.capacity:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {rows} rows")


@pytest.mark.parametrize("capacity, chosen", [(100, 16), (16, 16), (15, 8), (9, 8), (5, 4), (2, 2), (1, 1), (0, None)])
def test_largest_fitting_halves_on_out_of_memory(capacity, chosen):
    device, freed = FakeDevice(capacity), []
    size, failed = largest_fitting(candidates(16), device, free=lambda: freed.append(True))
    assert size == chosen
    assert failed == [s for s in [16, 8, 4, 2, 1] if s > capacity]
    assert device.tried == failed + ([chosen] if chosen else []) and len(freed) == len(failed)


def test_other_errors_are_not_taken_for_out_of_memory():
    def broken(rows):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        largest_fitting([4, 2, 1], broken)
    size, failed = largest_fitting([4, 2, 1], host_fits(per_row=10, budget=25))  # host memory: arithmetic
    assert (size, failed) == (2, [4])
    with pytest.raises(OutOfHostMemory, match="3 rows need"):
        host_fits(per_row=2**30, budget=2**31)(3)


def test_host_probe_measures_activations_that_grow_with_rows_and_length(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).train()
    grown = {}
    for length, rows in ((128, 1), (128, 4), (512, 1)):
        probe = Probe(model, torch.device("cpu"), 1, length)
        probe.step(1)  # gradients allocated first, as the real probe does
        grown[length, rows] = _peak_rss_growth(functools.partial(probe.step, rows))
    assert 2.5 < grown[128, 4] / grown[128, 1] < 6, grown  # about 4x the rows, about 4x the memory
    assert 2.5 < grown[512, 1] / grown[128, 1], grown  # (attention grows faster than the length)


def test_the_global_batch_kept():
    cfg = load_config(SFTConfig, None, [*REQUIRED, "batch_size=auto", "engine.gradient_accumulation_steps=2"])
    assert rows_per_step(cfg, world_size=2) == 16  # 8 (batch_size's default) x 2 accumulation, per rank
    cfg = load_config(SFTConfig, None, [*REQUIRED, "batch_size=auto", "global_batch_size=12"])
    assert rows_per_step(cfg, world_size=2) == 6
    with pytest.raises(ConfigError, match="global_batch_size: 12 rows do not split evenly over 8 ranks"):
        rows_per_step(cfg, world_size=8)
    rl = load_config(
        GRPOConfig,
        None,
        [
            *REQUIRED,
            "batch_size=auto",
            "reward.functions=length_penalty",
            "prompts_per_step=4",
            "rollout.n=4",
            "mini_batch_size=8",
        ],
        validate=False,
    )
    assert rows_per_step(rl, world_size=2) == 4  # mini_batch_size / world


def test_sft_with_auto_batch_size_keeps_the_global_batch_and_trains(
    tiny_model_dir, chat_jsonl, tmp_path, capsys, monkeypatch
):
    from trainer_lib.engine import batch_size

    # a host with 24 MiB free: 64 rows of 64 tokens (about 1.5 MiB each, measured) do not fit, 8 do
    monkeypatch.setattr(batch_size, "host_available", lambda: 24 * 2**20)
    out = tmp_path / "sft"
    assert (
        main(
            [
                "sft",
                f"model.path={tiny_model_dir}",
                f"data.path={chat_jsonl}",
                f"output_dir={out}",
                "batch_size=auto",
                "global_batch_size=64",
                "data.max_length=64",
                "max_steps=2",
                "save_steps=0",
                "eval_steps=0",
                "lr=3e-3",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("batch_size=auto: "))
    assert line.startswith(
        "batch_size=auto: micro-batch 8 x 8 accumulation x 1 rank(s) = 64 rows per optimizer "
        "step (64, 32, 16 did not fit); host memory: "
    ), line
    assert "estimate_zero2_model_states_mem_needs; ZeRO-0" in printed  # DeepSpeed's estimate, before the run
    config = json.load(open(out / "ds_config.json"))
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (8, 8)
    train = [json.loads(r) for r in open(out / "metrics.jsonl") if '"train"' in r]
    assert train[-1]["step"] == 2 and all(r["loss"] > 0 and r["grad_norm"] > 0 for r in train)


def test_reward_with_auto_batch_size_trains(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"Say {w}:", "chosen": f" {w}, kindly.", "rejected": f" {w}!!"}) + "\n"
            for w in "apple river stone cloud lamp green table seven".split()
        )
    )
    out = tmp_path / "rm"
    assert (
        main(
            [
                "reward",
                f"model.path={tiny_model_dir}",
                f"data.path={data}",
                f"output_dir={out}",
                "batch_size=auto",
                "global_batch_size=4",
                "data.max_length=64",
                "max_steps=2",
                "save_steps=0",
                "eval_steps=0",
            ]
        )
        == 0
    )
    assert "batch_size=auto: micro-batch 4 x 1 accumulation x 1 rank(s) = 4 rows" in capsys.readouterr().out
    assert json.load(open(out / "ds_config.json"))["train_micro_batch_size_per_gpu"] == 4


def test_grpo_with_auto_batch_size_keeps_the_mini_batch(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from tests.stages.training.rl_helpers import LENGTH_REWARD, one_thread, write_prompts
    from trainer_lib.engine import batch_size

    monkeypatch.setattr(batch_size, "host_available", lambda: 24 * 2**20)  # as above: 16 rows do not fit, 8 do
    out = tmp_path / "grpo"
    with one_thread():
        assert (
            main(
                [
                    "grpo",
                    f"model.path={tiny_model_dir}",
                    f"data.path={write_prompts(tmp_path / 'p.jsonl')}",
                    f"output_dir={out}",
                    f"reward.functions={LENGTH_REWARD}",
                    "batch_size=auto",
                    "prompts_per_step=4",
                    "rollout.n=4",
                    "mini_batch_size=16",
                    "rollout.max_new_tokens=8",
                    "data.max_length=56",
                    "max_steps=1",
                    "save_steps=0",
                    "eval_steps=0",
                ]
            )
            == 0
        )
    assert (
        "batch_size=auto: micro-batch 8 x 2 accumulation x 1 rank(s) = 16 rows per optimizer step (16 did not fit)"
    ) in capsys.readouterr().out
    config = json.load(open(out / "ds_config.json"))  # RL derives accumulation from mini_batch_size
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (8, 2)
