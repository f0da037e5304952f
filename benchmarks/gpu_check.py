"""The GPU check: one script that proves the cluster path on a GPU, and runs on CPU in ``make test``.

    python -m benchmarks.gpu_check [--device cuda|cpu] [--tiny] [--out FILE] [--budget S] [--workdir DIR]
    python -m benchmarks.gpu_check --device cpu --tiny --out runs/gpu_check.json   # the CPU mode (make test)
    python -m benchmarks.gpu_check --fetch-wheels runs/gpu_wheels  # here, before the device tool's command

On CUDA (the default when torch sees a GPU) it builds a Qwen2.5-0.5B-shaped Qwen2 from scratch (random
weights, bf16) with a BPE tokenizer trained on the demo data (nothing is downloaded), then runs each part
as its own ``posttrain`` stage process (``python -m trainer_lib.cli``, the module behind the console
script): SFT with packing (flash_attention_2 when ``import flash_attn`` works), DPO, GRPO with the
built-in ``length_penalty`` reward, SFT on 2 ranks, with ``parallel.tensor=2`` and with
``parallel.pipeline=2`` (with 2 GPUs), SFT killed after a checkpoint and rerun, against an
uninterrupted run (final weights compared), ``batch_size=auto``, evaluation in bf16 on 1 rank
(and 2 with 2 GPUs, merged metrics equal), the export with its FP16 variant and parity, that FP16 model
served by a local ``tritonserver`` on the GPU (when nvidia-pytriton is installed), vLLM evaluation when
vLLM imports and, when TRL imports, ``benchmarks.vs_trl --algo sft``. On CPU (``--tiny``) the same parts
run with a 2-layer, 64-wide model and a few steps, two at a time, without vs_trl, vLLM and the 2-rank
training runs. Each part is time-boxed; a failed part is recorded and the others still run. One JSON
(``--out``; default ``$OUT/gpu_check.json`` when ``$OUT`` is set, else ``runs/gpu_check.json``),
rewritten as each part ends, holds per part its status,
exit code, wall time, tokens/s, MFU, peak memory (and the resume diff, the auto batch size), plus
versions, GPUs and the date. Exit code 0: every required part passed. The device tool's command and
the expected time: benchmarks/README.md, "The GPU check".
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What the GPU machine's image lacks, or has at another version than requirements.lock: carried as wheels.
GPU_WHEELS = (
    "deepspeed hjson pydantic pydantic_core annotated-types typing-inspection typing_extensions datasets dill "
    "multiprocess fsspec transformers regex peft pycodestyle"
).split()
GPU_PYTHON = "3.12"  # the GPU image's python3 (/work/.library/device/KINDS.md)
STAGE = ["-m", "trainer_lib.cli"]  # `posttrain <stage>` (the console script adds only `posttrain pipeline`)
OPTIONAL = ("vs_trl", "vllm")  # parts whose failure does not fail the check (another library's install)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Model shape and run lengths of one mode."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    model_vocab: int  # embedding rows; 0: the tokenizer's vocabulary rounded up (unused rows, as in Qwen's)
    tokenizer_vocab: int
    demo: dict  # DemoSpec sizes of the demo data ({}: its defaults)
    precision: str
    max_length: int
    batch_size: int
    sft_steps: int
    dpo_steps: int
    grpo_steps: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    auto_global_batch: int  # batch_size=auto keeps this many rows per optimizer step
    eval_prompts: int  # held-out code tasks and safety prompts each, in the evaluate parts
    parity_prompts: int  # the export's parity prompts
    warmup: int  # first log records left out of tokens/s
    part_timeout: float


GPU = Settings(  # Qwen2.5-0.5B's shapes
    layers=24,
    hidden=896,
    heads=14,
    kv_heads=2,
    intermediate=4864,
    model_vocab=151936,
    tokenizer_vocab=8192,  # what a BPE learns from the demo corpus; the other rows stay unused
    demo={},
    precision="bf16",
    max_length=1024,
    batch_size=8,
    sft_steps=30,
    dpo_steps=12,
    grpo_steps=4,
    prompts_per_step=8,
    group_size=4,
    max_new_tokens=64,
    auto_global_batch=64,
    eval_prompts=64,
    parity_prompts=8,
    warmup=3,
    part_timeout=240,
)
TINY = dataclasses.replace(
    GPU,
    layers=2,
    hidden=64,
    heads=4,
    intermediate=256,
    model_vocab=0,
    tokenizer_vocab=512,
    demo=dict(n_code_train=160, n_code_eval=10, n_safety_train=40, n_safety_eval=10, n_safety_sft=20),
    max_length=128,
    batch_size=4,
    sft_steps=4,
    dpo_steps=3,
    grpo_steps=2,
    prompts_per_step=2,
    group_size=2,
    max_new_tokens=8,
    auto_global_batch=8,
    eval_prompts=4,
    parity_prompts=2,
    warmup=1,
)


@dataclasses.dataclass
class Context:
    """What every part reads: the mode, where things are, the deadline."""

    device: str
    settings: Settings
    workdir: str
    deadline: float  # time.monotonic() after which no part starts (inf: none)
    gpus: int
    attn: str  # SFT's model.attn_implementation
    keep: bool = False  # keep each run's output directory
    model: str = ""
    data: str = ""
    params: int = 0
    peak_flops: float = 0.0  # a large matmul timed in this process (as benchmarks/probe.py does for vs_trl)

    def env(self, **extra: str) -> dict:
        """A child's environment: its own process group (no RANK etc.), offline, the repository importable."""
        from trainer_lib.engine.process_group import own_group_env

        env = own_group_env()
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
            POSTTRAIN_CACHE=os.path.join(self.workdir, "cache"),
            POSTTRAIN_NO_PROGRESS="1",
            DS_ACCELERATOR=self.device,
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )
        if self.device == "cpu":
            env["OMP_NUM_THREADS"] = "1"  # two parts share the cores
        return {**env, **extra}

    def timeout(self) -> float:
        """Seconds the next run may take: the part's limit, or what is left of the budget."""
        return max(0.0, min(self.settings.part_timeout, self.deadline - time.monotonic()))

    def common(self, steps: int, save_steps: int = 0) -> list[str]:
        """Keys every stage run here shares."""
        return [
            f"model.path={self.model}",
            f"max_steps={steps}",
            f"engine.precision={self.settings.precision}",
            "logging_steps=1",
            "eval_steps=0",
            f"save_steps={save_steps}",
            "data.eval_fraction=0",
            f"data.max_length={self.settings.max_length}",
            "report_to=none",
            "lr=1e-5",
        ]


# --------------------------------------------------------------------------- running a stage process


def gpu_memory_used() -> list[int]:
    """Bytes in use on each GPU (nvidia-smi); [] without it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(line) * 2**20 for line in out.split() if line.strip().isdigit()]


def launch(ctx: Context, argv: list[str], log: str, *, until=None, env=None) -> dict:
    """Run ``python argv`` (a stage: ``[*STAGE, name, key=value, ...]``) in its own session, so that
    ``--nproc`` workers go with it, until it exits, ``until()`` turns true (then SIGKILL) or the part's
    time is up. Peak memory: on CUDA the most that nvidia-smi showed in use above the level at the
    start (on the fullest GPU), on CPU the child's peak RSS (wait4 reports the largest in its tree)."""
    timeout, start = ctx.timeout(), time.monotonic()
    base = gpu_memory_used() if ctx.device == "cuda" else []
    peak, sampled = list(base), 0.0
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=ROOT,
            env=env or ctx.env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    stopped = timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if not (stopped or timed_out):
            stopped = bool(until and until())
            timed_out = not stopped and time.monotonic() - start > timeout
            if stopped or timed_out:
                os.killpg(proc.pid, signal.SIGKILL)
        if base and time.monotonic() - sampled > 0.5:
            peak = [max(a, b) for a, b in zip(peak, gpu_memory_used() or peak)]
            sampled = time.monotonic()
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    result = {"exit_code": proc.returncode, "wall_s": round(time.monotonic() - start, 2), "stopped": stopped}
    result["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 2)  # the child's and its workers' CPU time
    if base:
        result.update(peak_memory_bytes=max(p - b for p, b in zip(peak, base)), peak_memory_kind="gpu, nvidia-smi")
    else:
        result.update(peak_memory_bytes=usage.ru_maxrss * 1024, peak_memory_kind="host RSS")  # KiB on Linux
    if timed_out:
        result["error"] = f"timed out after {timeout:.0f} s"
    return result


def log_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def throughput(out_dir: str, warmup: int) -> float | None:
    """Tokens/s over the train log records after the first ``warmup`` (logging_steps=1: a step each):
    each record's tokens_per_s weighted by its window, the time since the record before."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        records = [r for r in map(json.loads, filter(str.strip, fh)) if "tokens_per_s" in r]
    records = [r for r in records if r.get("split") == "train"]
    tokens = seconds = 0.0
    for before, record in list(zip(records, records[1:]))[max(warmup - 1, 0) :]:
        window = record["time"] - before["time"]
        tokens, seconds = tokens + record["tokens_per_s"] * window, seconds + window
    if seconds > 0:
        return tokens / seconds
    return records[-1]["tokens_per_s"] if records else None


def finish(result: dict, ok: bool, log: str | None = None) -> dict:
    """The part's record: its status, and the end of its log when it failed."""
    result.pop("stopped", None)
    result["status"] = "passed" if ok else "failed"
    if not ok and log:
        result["log_tail"] = "\n".join(log_text(log).splitlines()[-30:])
    return result


def stage_part(ctx: Context, name: str, argv: list[str], mfu_gpus: int = 0) -> dict:
    """One stage run: passed when it exits 0 with a saved model and tokens/s > 0. With ``mfu_gpus``,
    MFU = 6 * params * tokens/s / (GPUs * peak); attention FLOPs are not counted (as in vs_trl)."""
    out, log = os.path.join(ctx.workdir, name), os.path.join(ctx.workdir, f"{name}.log")
    run = launch(ctx, [*STAGE, *argv, f"output_dir={out}"], log)
    run["tokens_per_s"] = throughput(out, ctx.settings.warmup)
    if mfu_gpus and run["tokens_per_s"] and ctx.peak_flops:
        run["mfu"] = 6 * ctx.params * run["tokens_per_s"] / (mfu_gpus * ctx.peak_flops)
    ok = run["exit_code"] == 0 and os.path.exists(os.path.join(out, "model.safetensors"))
    if not ctx.keep:
        shutil.rmtree(out, ignore_errors=True)
    return finish(run, ok and (run["tokens_per_s"] or 0) > 0, log)


# --------------------------------------------------------------------------- the parts


def qwen2_config(s: Settings, vocab: int, pad: int, eos: int):
    """A Qwen2 config of the mode's shape (GPU: Qwen2.5-0.5B's, 494M parameters with its vocabulary)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        intermediate_size=s.intermediate,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=eos,
    )


def part_build(ctx: Context) -> dict:
    """The demo data, a tokenizer trained on its corpus, and a random Qwen2 of the mode's shape."""
    import torch
    from transformers import Qwen2ForCausalLM

    from trainer_lib.demo.demo_spec import DemoSpec
    from trainer_lib.demo.generator import generate_demo_data
    from trainer_lib.demo.tiny_model import train_tokenizer

    s, start = ctx.settings, time.monotonic()
    ctx.data, ctx.model = os.path.join(ctx.workdir, "data"), os.path.join(ctx.workdir, "model")
    generate_demo_data(ctx.data, DemoSpec(**s.demo))
    with open(os.path.join(ctx.data, "corpus.txt"), encoding="utf-8") as fh:
        tokenizer = train_tokenizer([line for line in fh if line.strip()], vocab_size=s.tokenizer_vocab)
    vocab = s.model_vocab or -(-(len(tokenizer) + 1) // 64) * 64
    config = qwen2_config(s, vocab, pad=tokenizer.pad_token_id, eos=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if s.precision == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(ctx.model, safe_serialization=True)
    tokenizer.save_pretrained(ctx.model)
    ctx.params = sum(p.numel() for p in model.parameters())
    result = {"parameters": ctx.params, "model_vocab": vocab, "tokenizer_vocab": len(tokenizer), "exit_code": 0}
    return finish({**result, "wall_s": round(time.monotonic() - start, 2)}, True)


def part_sft(ctx: Context) -> dict:
    s = ctx.settings
    argv = ["sft", f"data.path={ctx.data}/sft.jsonl", "data.packing=true", f"batch_size={s.batch_size}"]
    argv += [f"model.attn_implementation={ctx.attn}", *ctx.common(s.sft_steps)]
    return {**stage_part(ctx, "sft", argv, mfu_gpus=1), "attn_implementation": ctx.attn}


def part_dpo(ctx: Context) -> dict:
    s = ctx.settings
    argv = ["dpo", f"data.path={ctx.data}/preferences.jsonl", f"batch_size={s.batch_size}"]
    return stage_part(ctx, "dpo", [*argv, *ctx.common(s.dpo_steps)], mfu_gpus=1)


def part_grpo(ctx: Context) -> dict:
    """tokens/s here: prompt and completion tokens per second of whole steps, generation included (no MFU)."""
    s = ctx.settings
    completions = s.prompts_per_step * s.group_size
    argv = ["grpo", f"data.path={ctx.data}/rl_prompts.jsonl", "reward.functions=[length_penalty]"]
    argv += [f"prompts_per_step={s.prompts_per_step}", f"rollout.n={s.group_size}"]
    argv += [f"rollout.max_new_tokens={s.max_new_tokens}", f"rollout.batch_size={completions}"]
    argv += [f"batch_size={completions}", *ctx.common(s.grpo_steps)]
    return {**stage_part(ctx, "grpo", argv), "reward": "length_penalty"}


def part_two_rank(ctx: Context) -> dict:
    if ctx.device == "cpu":
        return {"status": "skipped", "note": "not on CPU (tests/engine/test_distributed.py runs --nproc 2 there)"}
    if ctx.gpus < 2:
        return {"status": "skipped", "note": f"{ctx.gpus} GPU: the 2-rank run needs 2"}
    s = ctx.settings
    argv = ["sft", "--nproc", "2", f"data.path={ctx.data}/sft.jsonl", "engine.zero_stage=2"]
    argv += [f"batch_size={s.batch_size}", *ctx.common(s.sft_steps // 2)]
    return {**stage_part(ctx, "two_rank", argv, mfu_gpus=2), "ranks": 2, "zero_stage": 2}


def model_parallel_part(ctx: Context, name: str, key: str, extra: tuple = ()) -> dict:
    """SFT with ``parallel.<key>=2`` on 2 GPUs (ZeRO-1): Qwen2.5-0.5B's 14 heads and 2 KV heads split in two
    (``tensor``, DeepSpeed AutoTP), its 24 layers in two stages (``pipeline``, DeepSpeed's pipeline engine), or
    each packed row in two halves (``sequence``, DeepSpeed's Ulysses; with tiled MLP and checkpointing)."""
    if ctx.device == "cpu":
        return {"status": "skipped", "note": f"not on CPU (tests/engine/test_model_parallel.py runs {key}=2 there)"}
    if ctx.gpus < 2:
        return {"status": "skipped", "note": f"{ctx.gpus} GPU: {key} parallelism needs 2"}
    s = ctx.settings
    argv = ["sft", "--nproc", "2", f"data.path={ctx.data}/sft.jsonl", f"parallel.{key}=2", "engine.zero_stage=1"]
    argv += [f"batch_size={s.batch_size}", *extra, *ctx.common(s.sft_steps // 2)]
    return {**stage_part(ctx, name, argv, mfu_gpus=2), "ranks": 2, key: 2}


def weights_diff(a: str, b: str) -> float:
    """Largest absolute difference between two runs' model.safetensors (inf when their tensors differ)."""
    from safetensors.torch import load_file

    left, right = load_file(os.path.join(a, "model.safetensors")), load_file(os.path.join(b, "model.safetensors"))
    if left.keys() != right.keys() or any(left[k].shape != right[k].shape for k in left):
        return float("inf")
    return max(float((left[k].float() - right[k].float()).abs().max()) for k in left)


def part_resume(ctx: Context) -> dict:
    """SFT killed with SIGKILL (tests.paused_cli holds it at its own mkdir of step 4's checkpoint, so step
    2's is complete), rerun with the same command; its final weights against an uninterrupted run.

    Eager attention without packing: its kernels are deterministic on CUDA too, so a difference is the
    resume's (SDPA's flash backward accumulates with atomics). When the weights differ, a second
    uninterrupted run tells nondeterminism (it differs as well) from a resume bug. The reference runs at
    the same time as the killed run and the rerun (on CUDA the part's peak memory counts both)."""
    from trainer_lib.engine.checkpoint import tag_for

    s, root, start = ctx.settings, os.path.join(ctx.workdir, "resume"), time.monotonic()
    argv = ["sft", f"data.path={ctx.data}/sft.jsonl", "data.packing=false", "model.attn_implementation=eager"]
    argv += [f"batch_size={s.batch_size}", *ctx.common(4, save_steps=2), "save_total_limit=1", "seed=1"]
    env, log = ctx.env(CUBLAS_WORKSPACE_CONFIG=":4096:8"), os.path.join(ctx.workdir, "resume.log")
    log_reference = os.path.join(ctx.workdir, "resume_reference.log")
    reference, run, ready = (os.path.join(root, d) for d in ("reference", "run", "held"))
    os.makedirs(root)
    stage = [*STAGE, *argv]
    # the killed run: tests/paused_cli.py as a file (with -m, an installed package named tests would win)
    paused = [os.path.join(ROOT, "tests", "paused_cli.py"), "mkdir"]
    paused += [re.escape(os.path.join(run, "checkpoints", tag_for(4))) + "$", ready, "--", *argv]

    def is_held() -> bool:
        return os.path.exists(ready)

    with concurrent.futures.ThreadPoolExecutor(1) as beside:  # the reference runs beside the other two
        uninterrupted = beside.submit(launch, ctx, [*stage, f"output_dir={reference}"], log_reference, env=env)
        runs = {"killed": launch(ctx, [*paused, f"output_dir={run}"], log, until=is_held, env=env)}
        before = len(log_text(log))
        runs["rerun"] = launch(ctx, [*stage, f"output_dir={run}"], log, env=env)
        runs["reference"] = uninterrupted.result()
    resumed = re.search(r"resuming at step (\d+)", log_text(log)[before:])
    finished = runs["reference"]["exit_code"] == 0 and runs["rerun"]["exit_code"] == 0
    result = {
        "exit_code": runs["rerun"]["exit_code"],
        "killed_at_checkpoint": runs["killed"]["stopped"],
        "resumed_at_step": int(resumed.group(1)) if resumed else None,
        "max_abs_diff": weights_diff(reference, run) if finished else None,
    }
    if result["max_abs_diff"] and ctx.timeout() > 60:
        runs["reference_again"] = launch(ctx, [*stage, f"output_dir={root}/again"], log, env=env)
        if runs["reference_again"]["exit_code"] == 0:
            result["repeat_max_abs_diff"] = weights_diff(reference, f"{root}/again")
    shutil.rmtree(root, ignore_errors=True)  # a 0.5B checkpoint is about 7 GB
    result["runs"] = {name: {k: v for k, v in r.items() if k != "stopped"} for name, r in runs.items()}
    result["wall_s"] = round(time.monotonic() - start, 2)
    result["peak_memory_bytes"] = max(r["peak_memory_bytes"] for r in runs.values())
    ok = finished and result["killed_at_checkpoint"] and result["resumed_at_step"] == 2
    return finish(result, ok and result["max_abs_diff"] == 0, log)


def part_auto_batch(ctx: Context) -> dict:
    s = ctx.settings
    argv = ["sft", f"data.path={ctx.data}/sft.jsonl", "batch_size=auto", f"global_batch_size={s.auto_global_batch}"]
    result = stage_part(ctx, "auto_batch", [*argv, "data.packing=false", *ctx.common(2)])
    probe = r"batch_size=auto: micro-batch (\d+) x (\d+) accumulation[^\n]*"
    found = re.search(probe, log_text(os.path.join(ctx.workdir, "auto_batch.log")))
    if found:
        result.update(auto_batch_size=int(found.group(1)), accumulation=int(found.group(2)), probe=found.group(0))
    elif result["status"] == "passed":
        result = finish({**result, "error": "no 'batch_size=auto:' line in the log"}, False)
    return result


def evaluate_argv(ctx: Context, out: str) -> list[str]:
    """``posttrain evaluate`` of the built model on the demo's held-out tasks and safety prompts (greedy)."""
    s = ctx.settings
    argv = ["evaluate", f"models=model={ctx.model}", f"data_dir={ctx.data}", "humaneval.enabled=false"]
    argv += [f"tasks.limit={s.eval_prompts}", f"safety.limit={s.eval_prompts}", "precision=auto", "engine=torch"]
    argv += [f"tasks.max_new_tokens={s.max_new_tokens}", f"safety.max_new_tokens={s.max_new_tokens}"]
    return [*argv, f"batch_size={s.batch_size}", f"output_dir={out}"]


def read_metrics(out: str) -> dict | None:
    path = os.path.join(out, "metrics.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def part_evaluate(ctx: Context) -> dict:
    """Evaluation in the mode's precision (``precision=auto``: bf16 on CUDA) on 1 rank, then on 2 ranks
    (``--nproc 2``, each generating its share of the batches) when there are 2 GPUs or on CPU: the merged
    metrics must equal the one-rank run's. Prompts answered per second, from the stage's own timing."""
    root, start = os.path.join(ctx.workdir, "evaluate"), time.monotonic()
    log = os.path.join(ctx.workdir, "evaluate.log")
    runs = {"one_rank": launch(ctx, [*STAGE, *evaluate_argv(ctx, f"{root}/one")], log)}
    one = read_metrics(f"{root}/one")
    result = {"exit_code": runs["one_rank"]["exit_code"], "precision": one and one["generation"]["precision"]}
    if one:
        result["metrics"] = one["models"]["model"]
        result["seconds"] = one["seconds"]
    if ctx.device == "cpu" or ctx.gpus >= 2:
        runs["two_ranks"] = launch(
            ctx, [*STAGE, "evaluate", "--nproc", "2", *evaluate_argv(ctx, f"{root}/two")[1:]], log
        )
        two = read_metrics(f"{root}/two")
        result["two_ranks_equal"] = bool(one and two and two["models"] == one["models"])
        result["two_ranks_seconds"] = two and two["seconds"]
        result["exit_code"] = result["exit_code"] or runs["two_ranks"]["exit_code"]
    else:
        result["note"] = f"{ctx.gpus} GPU: 2 ranks need 2 (NCCL takes one GPU per rank)"
    shutil.rmtree(root, ignore_errors=True)
    result.update(runs=runs, wall_s=round(time.monotonic() - start, 2))
    result["peak_memory_bytes"] = max(r["peak_memory_bytes"] for r in runs.values())
    ok = result["exit_code"] == 0 and one is not None and result.get("two_ranks_equal", True)
    return finish(result, ok, log)


def part_export(ctx: Context) -> dict:
    """``posttrain export``: FP32, FP16 (exported in half precision on CUDA) and INT8, with their parity
    against PyTorch. The random model's logits are flat, so top-1 agreement is reported, not required."""
    s, out = ctx.settings, os.path.join(ctx.workdir, "export")
    argv = ["export", f"model_path={ctx.model}", f"output_dir={out}", f"parity.num_prompts={s.parity_prompts}"]
    argv += [f"parity.max_new_tokens={s.max_new_tokens}", f"parity.latency_tokens={s.max_new_tokens}"]
    argv += ["parity.int8_min_top1_agreement=0", "parity.fp16_min_top1_agreement=0", "parity.threads=0"]
    log = os.path.join(ctx.workdir, "export.log")
    result = launch(ctx, [*STAGE, *argv], log)
    summary = os.path.join(out, "export.json")
    if result["exit_code"] == 0 and os.path.exists(summary):
        with open(os.path.join(out, "parity.json"), encoding="utf-8") as fh:
            parity = json.load(fh)
        for name in ("fp32", "fp16", "int8"):
            if name in parity:
                figures = parity[name]
                worst = max(figures["prefill"]["max_abs_diff"], figures["decode"]["max_abs_diff"])
                result[name] = {
                    "max_abs_diff": worst,
                    "top1_agreement": figures["top1_agreement"],
                    "greedy_exact_match": figures["greedy_exact_match"],
                    "decode_ms_per_token": figures.get("decode_ms_per_token"),
                }
        with open(summary, encoding="utf-8") as fh:
            result["fp16_source"] = json.load(fh).get("fp16_source")
        result["serve"] = serve_fp16(ctx, out, log)
    if not ctx.keep:
        shutil.rmtree(out, ignore_errors=True)
    served = result.get("serve", {}).get("status") in ("passed", "skipped")
    return finish(result, result["exit_code"] == 0 and "fp16" in result and served, log)


def serve_fp16(ctx: Context, exported: str, log: str) -> dict:
    """The FP16 export deployed (``variant=fp16``: a GPU instance on CUDA, the TensorRT/CUDA providers when
    onnxruntime has them) and asked one prompt through a local ``tritonserver``, beside PyTorch's greedy
    answer. Skipped where nvidia-pytriton (the server) is not installed."""
    from trainer_lib.errors import UserError
    from trainer_lib.serving.server import find_env

    try:
        find_env()
    except UserError as exc:
        return {"status": "skipped", "note": str(exc).splitlines()[0]}
    repo = os.path.join(ctx.workdir, "repository")
    kind = "gpu" if ctx.device == "cuda" else "cpu"
    deploy = ["deploy", f"export.path={exported}", f"repository={repo}", "model_name=check", "variant=fp16"]
    runs = {"deploy": launch(ctx, [*STAGE, *deploy, f"instance_kind={kind}"], log)}
    ask = ["serve", "--repo", repo, "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    ask += ["--ask", "def add(a, b):", "--compare", ctx.model, "--max-tokens", str(ctx.settings.max_new_tokens)]
    before = len(log_text(log))
    runs["ask"] = launch(ctx, [*STAGE, *ask], log)
    answer = next((json.loads(line) for line in log_text(log)[before:].splitlines() if line.startswith("{")), None)
    shutil.rmtree(repo, ignore_errors=True)
    result = {"instance_kind": kind, "runs": {k: {"exit_code": r["exit_code"]} for k, r in runs.items()}}
    if answer:  # a random model's near-tied logits may break greedy ties differently in FP16: shown, not required
        result.update(served=answer["text_output"], pytorch=answer.get("pytorch"))
        result["served_equals_pytorch"] = answer["text_output"] == answer.get("pytorch")
    ok = all(r["exit_code"] == 0 for r in runs.values()) and answer is not None
    return {**result, "status": "passed" if ok else "failed"}


def part_vllm(ctx: Context) -> dict:
    """Evaluation through vLLM (``engine=vllm``), when it imports on a CUDA machine; its metrics beside the
    torch engine's are in the JSON (sampling kernels differ, so they are shown, not compared)."""
    import importlib.util

    if ctx.device != "cuda" or importlib.util.find_spec("vllm") is None:
        return {"status": "skipped", "note": "vllm is not installed" if ctx.device == "cuda" else "not on CPU"}
    out, log = os.path.join(ctx.workdir, "vllm"), os.path.join(ctx.workdir, "vllm.log")
    argv = [a.replace("engine=torch", "engine=vllm") for a in evaluate_argv(ctx, out)]
    result = launch(ctx, [*STAGE, *argv], log)
    metrics = read_metrics(out)
    if metrics:
        result.update(metrics=metrics["models"]["model"], seconds=metrics["seconds"])
    shutil.rmtree(out, ignore_errors=True)
    return finish(result, result["exit_code"] == 0 and metrics is not None, log)


def trl_python(explicit: str | None) -> str | None:
    """An interpreter where ``import trl`` works: --trl-python, else .venv-bench's, else this one."""
    candidates = [explicit] if explicit else [os.path.join(ROOT, ".venv-bench", "bin", "python"), sys.executable]
    for python in candidates:
        if os.path.exists(python):
            if subprocess.run([python, "-c", "import trl"], capture_output=True, timeout=120).returncode == 0:
                return python
    return None


def part_vs_trl(ctx: Context, explicit: str | None) -> dict:
    if ctx.device != "cuda":
        return {"status": "skipped", "note": "CUDA only (tests/benchmarks/test_vs_trl_smoke.py runs it on CPU)"}
    if ctx.timeout() < 120:
        return {"status": "skipped", "note": "under 2 minutes of the budget left"}
    python = trl_python(explicit)
    if python is None:
        return {"status": "skipped", "note": "no interpreter here imports trl (make bench builds .venv-bench)"}
    out, log = os.path.join(ctx.workdir, "vs_trl.json"), os.path.join(ctx.workdir, "vs_trl.log")
    argv = ["-m", "benchmarks.vs_trl", "--device", "cuda", "--algo", "sft", "--rounds", "1", "--steps", "8"]
    run = launch(ctx, [*argv, "--json", out, "--trl-python", python], log)
    if run["exit_code"] != 0 or not os.path.exists(out):
        return finish(run, False, log)
    with open(out, encoding="utf-8") as fh:
        results = json.load(fh)["results"]
    keys = ("tokens_per_s", "peak_memory_bytes", "mfu", "final_loss")
    run["sides"] = {side: {k: rounds[0][k] for k in keys} for side, rounds in results.items()}
    ratio = re.search(r"ratio throughput=(\S+) memory=(\S+)", log_text(log))
    run["ratio"] = {"throughput": float(ratio.group(1)), "memory": float(ratio.group(2))} if ratio else None
    return finish({**run, "trl_python": python}, True)


# --------------------------------------------------------------------------- the report


def versions() -> dict:
    import torch

    found = {"python": platform.python_version(), "cuda": torch.version.cuda}
    names = "torch deepspeed transformers flash-attn accelerate peft datasets trl tokenizers pyarrow numpy"
    for name in names.split():
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def gpu_names() -> list[str]:
    """'name, memory, driver' of each GPU (nvidia-smi)."""
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def flash_attention() -> tuple[str, str]:
    """(SFT's attn_implementation, why)."""
    try:
        import flash_attn

        return "flash_attention_2", f"flash-attn {flash_attn.__version__} imports"
    except Exception as exc:  # not installed, or built for another torch or CUDA
        return "sdpa", f"import flash_attn failed ({type(exc).__name__}: {str(exc)[:200]}): sdpa"


def write_logs(workdir: str, path: str, lines: int = 300) -> None:
    """The end of every run's log, one after the other, in one file (the device tool brings back 8 files)."""
    with open(path, "w", encoding="utf-8") as fh:
        for name in sorted(f for f in os.listdir(workdir) if f.endswith(".log")):
            fh.write(
                f"==> {name} <==\n" + "\n".join(log_text(os.path.join(workdir, name)).splitlines()[-lines:]) + "\n"
            )


def default_out() -> str:
    """$OUT/gpu_check.json where the device tool's $OUT is set (what is written there comes back), else runs/."""
    return os.path.join(os.environ.get("OUT") or "runs", "gpu_check.json")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when torch sees a GPU")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide model and a few steps (always on CPU)")
    p.add_argument("--out", default=None, help="the JSON (default $OUT/gpu_check.json, else runs/gpu_check.json)")
    p.add_argument("--budget", type=float, default=None, help="seconds for everything (default 480 on CUDA)")
    p.add_argument("--workdir", default=None, help="where the model and runs go (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep every run's output directory")
    p.add_argument("--jobs", type=int, default=None, help="parts at a time (default 1 on CUDA, 2 on CPU)")
    p.add_argument("--trl-python", default=None, help="interpreter with trl for vs_trl (default: looked for)")
    p.add_argument("--fetch-wheels", metavar="DIR", help="download what the GPU machine lacks into DIR, and exit")
    return p.parse_args(argv)


def fetch_wheels(dest: str) -> int:
    """GPU_WHEELS at requirements.lock's versions and trl, as wheels for the GPU image's Python. DeepSpeed
    has only a source release: its wheel is built here (pure Python; it compiles its ops when used)."""
    with open(os.path.join(ROOT, "requirements.lock"), encoding="utf-8") as fh:
        pins = dict(line.strip().split("==", 1) for line in fh if "==" in line and not line.startswith("#"))
    pins = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins.items()}
    wanted = [f"{name}=={pins[re.sub(r'[-_.]+', '-', name).lower()]}" for name in GPU_WHEELS] + ["trl==1.16.*"]
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dest, wanted[0]], check=True)
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (28, 27, 17)] + ["--platform=manylinux2014_x86_64"]
    tags = ["--only-binary=:all:", f"--python-version={GPU_PYTHON}", "--implementation=cp", *platforms]
    subprocess.run([*pip, "download", "-q", "--no-deps", *tags, "-d", dest, *wanted[1:]], check=True)
    total = sum(os.path.getsize(os.path.join(dest, f)) for f in os.listdir(dest))
    print(f"{len(os.listdir(dest))} wheels, {total / 2**20:.1f} MiB in {dest}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.fetch_wheels:
        return fetch_wheels(args.fetch_wheels)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    settings = TINY if args.tiny or device == "cpu" else GPU  # (a 0.5B model on CPU proves nothing more)
    budget = args.budget if args.budget is not None else (480.0 if device == "cuda" else 0.0)
    started = time.monotonic()
    workdir = args.workdir or tempfile.mkdtemp(prefix="gpu_check_")
    os.makedirs(workdir, exist_ok=True)
    attn, attn_note = flash_attention() if device == "cuda" else ("sdpa", "not on CPU")
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    deadline = started + budget if budget else float("inf")
    ctx = Context(device, settings, workdir, deadline, gpus, attn, keep=args.keep)
    out = args.out or default_out()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "model": "tiny" if settings is TINY else "qwen2.5-0.5b-shaped",
        "command": " ".join(["python -m benchmarks.gpu_check", *argv]),
        "versions": versions(),
        "gpu_count": gpus,
        "gpus": gpu_names() if device == "cuda" else [],
        "flash_attention": attn_note,
        "settings": dataclasses.asdict(settings),
        "parts": {},
    }
    parts, lock = report["parts"], threading.Lock()

    def record(name: str, part: dict) -> None:
        """Keep a part's result, print its line and rewrite the JSON (a run cut short keeps what ended)."""
        part["required"] = name not in OPTIONAL and part["status"] != "skipped"
        with lock:
            parts[name] = part
            with open(out, "w", encoding="utf-8") as fh:
                json.dump(report, fh, indent=1, default=str)
            write_logs(workdir, os.path.splitext(out)[0] + ".runs.log")
        figures = [f"{k}={part[k]:.4g}" for k in ("wall_s", "tokens_per_s", "max_abs_diff") if part.get(k)]
        note = part.get("error") or part.get("note") or ""
        print(f"gpu_check: {name:<10} {part['status']:<7} {' '.join(figures)} {note}".rstrip(), flush=True)

    try:
        build = part_build(ctx)
        from benchmarks.probe import measure_peak_flops  # bf16 on CUDA, fp32 on CPU

        ctx.peak_flops = report["peak_flops"] = measure_peak_flops(device, 8192 if device == "cuda" else 1024)
        record("build", build)
    except Exception as exc:  # every other part needs the model: they are skipped
        record("build", {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
    runners = {
        "sft": part_sft,
        "dpo": part_dpo,
        "grpo": part_grpo,
        "two_rank": part_two_rank,
        "tensor_parallel": lambda c: model_parallel_part(c, "tensor_parallel", "tensor"),
        "pipeline_parallel": lambda c: model_parallel_part(
            c, "pipeline_parallel", "pipeline", ("engine.gradient_accumulation_steps=4",)
        ),
        "sequence_parallel": lambda c: model_parallel_part(
            c, "sequence_parallel", "sequence", ("engine.tiled_mlp=true", "engine.gradient_checkpointing=true")
        ),
        "resume": part_resume,
        "auto_batch": part_auto_batch,
        "evaluate": part_evaluate,
        "export": part_export,
        "vllm": part_vllm,
        "vs_trl": lambda c: part_vs_trl(c, args.trl_python),
    }

    def run_part(name: str) -> None:
        if parts["build"]["status"] != "passed":
            part = {"status": "skipped", "note": "the build part failed"}
        elif ctx.timeout() < 30:
            part = {"status": "failed" if name not in OPTIONAL else "skipped", "error": "out of time (--budget)"}
        else:
            try:
                part = runners[name](ctx)
            except Exception as exc:  # a broken part is recorded; the others still run
                part = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        record(name, part)

    jobs = args.jobs or (1 if device == "cuda" else 2)
    order = sorted(runners, key=lambda n: n != "resume") if jobs > 1 else list(runners)  # the longest first
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(run_part, order))
    report["parts"] = parts = {name: parts[name] for name in ["build", *runners]}
    report["passed"] = all(p["status"] == "passed" for p in parts.values() if p["required"])
    report["wall_s"] = round(time.monotonic() - started, 2)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, default=str)
    print(f"gpu_check: {'passed' if report['passed'] else 'FAILED'} in {report['wall_s']:.0f} s; {out}")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
