"""Worker for tests/engine/test_pipeline_parallel.py, and the data and one-process reference it is compared with.

Launched as ``torchrun --nproc_per_node 2 pipeline_worker.py ROOT``: trains each tiny model of MODELS (saved
under ROOT/<name> by :func:`make_model_dir`) in two pipeline stages for STEPS steps (GAS micro-batches each,
packed rows of different lengths and a padded batch), evaluates and saves the HF model. The "tied" one is
also checkpointed after RESUME_AT, and a fresh engine built from the untrained model loads that checkpoint
and trains the remaining steps. Rank 0 writes the results to ROOT/result.json.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

STEPS, GAS, RESUME_AT = 4, 2, 2
LR, BETAS, EPS, WEIGHT_DECAY, MAX_GRAD_NORM = 3e-3, (0.9, 0.95), 1e-8, 0.1, 0.3
VOCAB = 256


#: name -> (ZeRO stage, resume from a checkpoint): Llama with tied and untied embeddings, Qwen2 with
#: sliding-window layers after full ones (tied), Mistral with a sliding window shorter than the rows, and
#: LoRA adapters on an untied Llama.
MODELS = {"tied": (0, True), "untied": (1, False), "qwen2": (0, False), "mistral": (0, False), "lora": (0, False)}


def make_model_dir(root: str, name: str) -> str:
    import transformers

    torch.manual_seed(0)
    shape = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if name == "qwen2":
        config = transformers.Qwen2Config(
            **shape, use_sliding_window=True, sliding_window=8, max_window_layers=2, tie_word_embeddings=True
        )
    elif name == "mistral":
        config = transformers.MistralConfig(**shape, sliding_window=8, tie_word_embeddings=False)
    else:
        config = transformers.LlamaConfig(**shape, tie_word_embeddings=name == "tied")
    torch.manual_seed(0)
    path = os.path.join(root, name)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def load(path: str):
    """The saved model in fp32; the "lora" one with fresh LoRA adapters (seeded, no dropout) on q and v."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if os.path.basename(path) != "lora":
        return model
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(2)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))


def _packed_row(gen: torch.Generator, lengths: list[int]) -> dict:
    """One packed row as collate_packed makes it: positions restart, each sequence's first label is -100,
    and a prompt-like head of each sequence is masked too."""
    ids, labels, positions = [], [], []
    for n in lengths:
        seq = torch.randint(3, VOCAB, (n,), generator=gen).tolist()
        prompt = n // 3
        ids += seq
        labels += [-100] * max(prompt, 1) + seq[max(prompt, 1) :]
        positions += list(range(n))
    return {
        "input_ids": torch.tensor([ids]),
        "labels": torch.tensor([labels]),
        "position_ids": torch.tensor([positions]),
    }


def _padded(gen: torch.Generator, lengths: list[int]) -> dict:
    """Right-padded rows with an attention mask, as collate_padded makes them."""
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    labels = torch.full((len(lengths), width), -100)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        seq = torch.randint(3, VOCAB, (n,), generator=gen)
        ids[row, :n], labels[row, 2:n], mask[row, :n] = seq, seq[2:], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def data() -> tuple[list[list[dict]], list[dict]]:
    """(STEPS steps of GAS micro-batches, eval micro-batches): lengths differ between micro-batches."""
    gen = torch.Generator().manual_seed(1)
    shapes = [[9, 14], [20], [5, 7, 11], "pad", [30], [6, 6, 6, 6], [13, 4], [17, 2]]
    micro = [_padded(gen, [12, 7]) if s == "pad" else _packed_row(gen, s) for s in shapes]
    steps = [micro[i : i + GAS] for i in range(0, len(micro), GAS)]
    return steps, [_packed_row(gen, [10, 15]), _padded(gen, [8, 19, 4])]


def _decays(name: str, param) -> bool:
    return not (param.ndim < 2 or "norm" in name.lower())


def optimizer(named_params):
    """AdamW with the strategy's decay rule (no decay for norms and vectors)."""
    params = [(n, p) for n, p in named_params if p.requires_grad]
    groups = [
        {"params": [p for n, p in params if _decays(n, p)], "weight_decay": WEIGHT_DECAY},
        {"params": [p for n, p in params if not _decays(n, p)], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)


def reference(model_dir: str) -> dict:
    """The same training on one process without the pipeline: HF forward, mean over micro-batches."""
    model = load(model_dir)
    opt = optimizer(model.named_parameters())
    steps, evals = data()
    losses, norms = [], []
    for micro in steps:
        total = 0.0
        for batch in micro:
            loss = model(**batch, use_cache=False).loss / len(micro)
            loss.backward()
            total += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)))
        opt.step()
        opt.zero_grad()
        losses.append(total)
    with torch.no_grad():
        total = count = 0.0
        for batch in evals:
            n = int((batch["labels"][:, 1:] != -100).sum())
            total += float(model(**batch, use_cache=False).loss) * n
            count += n
    adapter = {}
    if hasattr(model, "merge_and_unload"):
        from peft import get_peft_model_state_dict

        adapter = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
        model = model.merge_and_unload()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"losses": losses, "grad_norms": norms, "eval": [total, count], "state": state, "adapter": adapter}


def _engine(model_dir: str, zero_stage: int):
    import deepspeed

    from trainer_lib.engine.pipeline import pipeline_module

    model = load(model_dir)
    module = pipeline_module(model, 2, activation_checkpoint_interval=1)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": GAS,
        "train_batch_size": GAS,
        "gradient_clipping": MAX_GRAD_NORM,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer(module.named_parameters()), config=config)
    return model, engine


def _train(model_dir: str, out: str, zero_stage: int, resume: bool) -> dict:
    """STEPS steps (a checkpoint after RESUME_AT), evaluation, the HF save, and with ``resume`` a fresh
    engine continuing from the checkpoint."""
    from trainer_lib.engine.checkpoint import weights_only_loads
    from trainer_lib.engine.pipeline import eval_sums, grad_norm, save_pipeline_hf_model, train_step

    steps, evals = data()
    start = time.perf_counter()
    model, engine = _engine(model_dir, zero_stage)
    losses, norms = [], []
    for index, micro in enumerate(steps):
        losses.append(train_step(engine, micro))
        norms.append(grad_norm(engine))
        if resume and index + 1 == RESUME_AT:
            engine.save_checkpoint(os.path.join(out, "ckpt"), tag="resume", save_latest=False)
    result = {"losses": losses, "grad_norms": norms, "train_s": time.perf_counter() - start}
    result["eval"] = eval_sums(engine, evals)
    result["one_by_one"] = [eval_sums(engine, [b]) for b in evals]  # one micro-batch a call, as sharded_sums
    save_pipeline_hf_model(engine, model, None, os.path.join(out, "hf"))
    if hasattr(model, "peft_config"):
        save_pipeline_hf_model(engine, model, None, os.path.join(out, "adapter"), merge_lora=False)
    if resume:
        _, engine = _engine(model_dir, zero_stage)  # fresh weights: everything that counts comes from the checkpoint
        with weights_only_loads():  # as DeepSpeedStrategy.load_checkpoint loads
            engine.load_checkpoint(os.path.join(out, "ckpt"), tag="resume")
        result["resumed"] = [train_step(engine, micro) for micro in steps[RESUME_AT:]]
    return result


def main(root: str) -> None:
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    results = {
        name: _train(os.path.join(root, name), os.path.join(root, "out", name), zero, resume)
        for name, (zero, resume) in MODELS.items()
    }
    if dist.get_rank() == 0:
        with open(os.path.join(root, "result.json"), "w", encoding="utf-8") as fh:
            json.dump(results, fh)
    dist.barrier()


if __name__ == "__main__":
    from trainer_lib.engine.process_group import exit_worker, leave_process_group

    main(sys.argv[1])
    leave_process_group()
    exit_worker(0)
