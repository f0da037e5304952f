"""TRL's side of a benchmark run: ``python -m benchmarks.side_trl SPEC OUT`` (``.venv-bench``).

The same model directory, data file and settings as ``benchmarks.side_ours``, through TRL's
trainer for the algorithm, offline (``Dataset.from_list``, ``report_to=[]``, ``use_cpu`` on CPU).
Step ends come from a ``TrainerCallback.on_step_end``, the final loss from ``on_log``.
"""

from __future__ import annotations

import json
import os
import sys

from benchmarks.probe import Probe, write_result


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    probe = Probe.from_spec(spec)
    probe.install()

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    class Timing(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            probe.step_end()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                probe.losses.append(float(logs["loss"]))

    algo, cuda = spec["algo"], spec["device"] == "cuda"
    dtype = torch.bfloat16 if spec["precision"] == "bf16" else torch.float32
    with open(spec["data_path"], encoding="utf-8") as f:
        dataset = Dataset.from_list([json.loads(line) for line in f if line.strip()])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    common = dict(
        output_dir=os.path.join(os.path.dirname(out_path), os.path.basename(out_path) + ".run"),
        max_steps=spec["steps"],
        per_device_train_batch_size=spec["batch_size"],
        gradient_accumulation_steps=spec["accumulation"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=spec["adam_beta1"],
        adam_beta2=spec["adam_beta2"],
        adam_epsilon=spec["adam_epsilon"],
        weight_decay=spec["weight_decay"],
        max_grad_norm=spec["max_grad_norm"],
        bf16=spec["precision"] == "bf16",
        gradient_checkpointing=False,
        use_cpu=not cuda,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=spec["seed"],
        dataloader_num_workers=0,
    )
    torch.manual_seed(spec["seed"])  # the reward head is initialised here, before the Trainer seeds
    if algo == "reward":
        model = AutoModelForSequenceClassification.from_pretrained(spec["model_dir"], num_labels=1, dtype=dtype)
        model.config.pad_token_id = tokenizer.pad_token_id
    else:
        model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=dtype)

    if algo == "sft":
        config = trl.SFTConfig(**common, max_length=spec["max_length"], packing=False)
        trainer = trl.SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    elif algo == "reward":
        config = trl.RewardConfig(**common, max_length=spec["max_length"])
        trainer = trl.RewardTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    elif algo == "dpo":
        config = trl.DPOConfig(**common, max_length=spec["max_length"], beta=spec["dpo_beta"], loss_type=["sigmoid"])
        trainer = trl.DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    else:
        from benchmarks.vs_trl import length_reward

        completions = spec["prompts_per_step"] * spec["group_size"]
        config = trl.GRPOConfig(
            **{**common, "per_device_train_batch_size": completions, "gradient_accumulation_steps": 1},
            num_generations=spec["group_size"],
            max_completion_length=spec["max_new_tokens"],
            temperature=spec["temperature"],
            top_k=0,
            top_p=1.0,
            beta=0.0,
            loss_type="grpo",
            scale_rewards="group",
            num_iterations=1,
            steps_per_generation=1,
        )
        trainer = trl.GRPOTrainer(
            model=model, args=config, train_dataset=dataset, processing_class=tokenizer, reward_funcs=[length_reward]
        )
    trainer.add_callback(Timing())
    trainer.train()
    write_result(out_path, probe.result(spec["prompts_per_step"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
