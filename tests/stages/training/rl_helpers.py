"""Shared by the GRPO and PPO stage tests: a prompt dataset and the mean reward of a saved policy."""

import contextlib
import json
import os

from tests.conftest import CHAT_ROWS, REPO

LENGTH_REWARD = os.path.join(REPO, "tests", "rewards", "length_reward.py") + ":reward"


@contextlib.contextmanager
def one_thread():
    """Run torch single-threaded: a tiny model's ops are too small to split, and on a busy 2-core
    machine the second thread's spin-waits make the RL tests 10-20x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_rl(stage: str, model, data, out, seed: int, *extra: str) -> None:
    """``posttrain <stage>`` (ppo or grpo) on ``data`` with the length reward: 4 prompts x 4 completions of at
    most 16 tokens per step, logged every 5 steps; ``extra`` keys come last and win."""
    from trainer_lib.cli import main

    args = [
        stage,
        f"model.path={model}",
        f"data.path={data}",
        f"output_dir={out}",
        f"reward.functions={LENGTH_REWARD}",
        "rollout.n=4",
        "prompts_per_step=4",
        "rollout.max_new_tokens=16",
        "batch_size=8",
        "logging_steps=5",
        "data.eval_fraction=0",
        f"seed={seed}",
        *extra,
    ]
    assert main(args) == 0


def write_prompts(path, count: int = 24) -> str:
    """Conversational prompt-only rows (distinct, so none is dropped as a duplicate)."""
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(count):
            question = CHAT_ROWS[i % len(CHAT_ROWS)][0] + " " * (i // len(CHAT_ROWS))
            fh.write(json.dumps({"prompt": [{"role": "user", "content": question}], "row": i}) + "\n")
    return str(path)


def mean_sampled_reward(model_dir, prompts_path, n: int = 8, max_new_tokens: int = 16, seed: int = 1234) -> float:
    """Mean length reward of ``n`` sampled completions per prompt from the model saved in ``model_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.rewards.length_reward import reward
    from trainer_lib.data.preference_batches import encode_prompt
    from trainer_lib.rl.rollout import generate

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with open(prompts_path, encoding="utf-8") as fh:
        prompts = [json.loads(line)["prompt"] for line in fh]
    rollout = generate(
        model,
        tokenizer,
        [encode_prompt(tokenizer, p) for p in prompts],
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        seed=seed,
    )
    values = reward(None, rollout.completions)
    return sum(values) / len(values)


def weights(model_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(model_dir, "model.safetensors"))


def write_reward_adapter(base_dir, out, reward_mean: float = 0.1, reward_std: float = 0.5) -> str:
    """A LoRA reward model of ``base_dir`` as the reward stage saves it with lora.merge=false (adapter,
    score head, tokenizer, reward statistics); random adapter weights, so it differs from the base."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainer_lib.config import LoraConfig
    from trainer_lib.models.heads import STATS_FILE, apply_reward_lora

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    with (
        torch.random.fork_rng()
    ):  # the new score head and LoRA A draw from the global RNG: the same model in any test order
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=1)
        model.config.pad_token_id = tokenizer.pad_token_id
        model = apply_reward_lora(model, LoraConfig(r=4, alpha=8))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    with open(os.path.join(out, STATS_FILE), "w", encoding="utf-8") as fh:
        json.dump({"reward_mean": reward_mean, "reward_std": reward_std}, fh)
    return str(out)
