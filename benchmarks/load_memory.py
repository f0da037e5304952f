"""Host memory of loading a model on N ranks: ZeRO-3 builds it partitioned, ZeRO-2 loads it whole per rank.

    python -m benchmarks.load_memory [--layers 20 --hidden 2048 --intermediate 5632 --vocab 32000]
        [--nproc 2] [--stages 3,2] [--lora 8] [--json OUT] [--keep DIR]

Saves a randomly initialised Llama (default about 1B parameters) once as fp32 safetensors in shards
of at most ``--shard`` (1GB, as hub checkpoints are sharded), then for each ZeRO stage starts
``--nproc`` ranks with torchrun (gloo on CPU). Each rank runs what a training stage runs: the
strategy set up, the model loaded with ``strategy.placement()``, LoRA adapters on it (``--lora``; 0
trains it all, whose AdamW states at 1B would not fit the 24 GiB machine twice), ``strategy.prepare``
(AdamW, the DeepSpeed engine) and one optimizer step. Reported per rank, from ``/proc/self/status``:

    load peak       the high-water mark of resident memory from process start until the model is
                    loaded (and, under ZeRO-3, partitioned): before the optimizer is built
    load growth     that peak less the memory held just before loading (imports, process group)
    whole run       the high-water mark at the end, after the engine and one step

each also as a ratio to the fp32 weights' size (a whole copy per rank is at least 1x), with the
anonymous and file-backed shares of resident memory after loading and at the end. A plain
``from_pretrained`` of fp32 weights at fp32 maps the safetensors files instead of reading them: its
"load" costs nothing until a forward touches every page (then file-backed, ~1x per rank, shared
between the ranks of a node in the page cache); see the whole-run figures for ZeRO-2.

The checkpoint is deleted at the end unless ``--keep``. Not part of ``make test``;
``tests/models/test_load_zero3.py`` runs the same worker on a small model. ~1B fp32 is ~4 GB on
disk and in memory per copy: check ``df -h`` and ``free -g`` first.

The worker (``--worker``, started by torchrun) can also write the model as loaded (``--save-loaded``,
through ``strategy.save_hf_model``) before training, to compare it with a plain load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_checkpoint(out: str, layers: int, hidden: int, intermediate: int, vocab: int, shard: str) -> int:
    """A random Llama saved as fp32 safetensors shards of at most ``shard``; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 128, 1),
        num_key_value_heads=max(hidden // 512, 1),
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, max_shard_size=shard)
    count = model.num_parameters()
    del model
    return count


def _status() -> dict:
    """This process's resident memory figures in bytes: VmRSS, VmHWM (its peak), RssAnon, RssFile."""
    values = {}
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def _reset_peak() -> None:
    """Linux: the high-water mark starts again from the current resident size."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")


def worker(args) -> None:
    """One rank: set up, load (measured), optionally save the loaded model, prepare, one step."""
    # what loading would otherwise import on its way (so the measured growth is the model's, not modules')
    import deepspeed.runtime.zero.partition_parameters  # noqa: F401
    import torch
    import transformers.models.llama.modeling_llama  # noqa: F401

    from trainer_lib.config import EngineConfig, LoraConfig, ModelConfig
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.models.load import apply_lora, load_causal_lm

    strategy = DeepSpeedStrategy(EngineConfig(zero_stage=args.zero_stage), micro_batch_size=1, seed=0)
    strategy.setup_distributed()
    placement = strategy.placement()
    strategy.barrier()
    start = _status()
    _reset_peak()
    model = load_causal_lm(ModelConfig(path=args.model), "fp32", placement=placement)
    loaded = _status()
    strategy.barrier()
    if args.save_loaded:
        strategy.save_hf_model(model, None, args.save_loaded)
    model = apply_lora(model, LoraConfig(r=args.lora, target_modules=["q_proj", "v_proj"]))
    engine = strategy.prepare(model, lr=1e-3, weight_decay=0.0, total_steps=1)
    engine.train()
    ids = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(strategy.rank))
    loss = engine(input_ids=ids.to(strategy.device), labels=ids.to(strategy.device), use_cache=False).loss
    strategy.backward(loss, engine)
    strategy.optimizer_step(engine)
    end = _status()
    record = {
        "rank": strategy.rank,
        "zero_stage": args.zero_stage,
        "rss_before_load": start["VmRSS"],
        "peak_before_load": start["VmHWM"],
        "load_peak": max(start["VmHWM"], loaded["VmHWM"]),
        "load_growth": loaded["VmHWM"] - start["VmRSS"],
        "loaded_anon": loaded["RssAnon"],
        "loaded_file": loaded["RssFile"],
        "run_peak": max(start["VmHWM"], loaded["VmHWM"], end["VmHWM"]),
        "run_anon": end["RssAnon"],
        "run_file": end["RssFile"],
        "loss": float(loss),
        "grad_norm": strategy.grad_norm(engine),
    }
    with open(args.records, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def run_stage(
    model: str, stage: int, nproc: int, log: str, lora: int = 0, save_loaded: str | None = None
) -> list[dict]:
    """Start ``nproc`` workers at ZeRO ``stage`` (training LoRA adapters of rank ``lora`` on the loaded model,
    or all of it with 0); their records, by rank."""
    from trainer_lib.engine.process_group import free_port, own_group_env

    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1"]
    cmd += ["--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "benchmarks.load_memory", "--worker"]
    cmd += ["--model", model, "--zero-stage", str(stage), "--records", log, "--lora", str(lora)]
    cmd += ["--save-loaded", save_loaded] if save_loaded else []
    # glibc's mmap threshold fixed at its default, so freed large blocks leave resident memory
    child_env = own_group_env() | {"MALLOC_MMAP_THRESHOLD_": "131072"}
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env["PYTHONPATH"] = ROOT + os.pathsep + child_env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"ZeRO-{stage} workers failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    with open(log, encoding="utf-8") as fh:
        records = [r for r in map(json.loads, fh) if r["zero_stage"] == stage]
    return sorted(records, key=lambda r: r["rank"])


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--zero-stage", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    parser.add_argument("--save-loaded", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard", default="1GB", help="max_shard_size of the saved checkpoint")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument(
        "--lora",
        type=int,
        default=8,
        help="train LoRA adapters of this rank in the step (0: the whole model, whose "
        "AdamW states at ~1B would fill the 24 GiB machine)",
    )
    parser.add_argument("--stages", default="3,2", help="ZeRO stages to run, in order")
    parser.add_argument("--keep", help="build the checkpoint here and keep it (default: a temporary directory)")
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)
    if args.worker:
        from trainer_lib.engine.process_group import exit_worker, leave_process_group

        worker(args)
        leave_process_group()
        exit_worker(0)  # C++ destructors of the CPU comm op can abort a finished rank (SIGABRT)

    root = args.keep or tempfile.mkdtemp(prefix="load_memory_")
    model_dir = os.path.join(root, "model")
    try:
        counted = os.path.join(root, "parameters.json")
        if not os.path.exists(counted):
            count = build_checkpoint(model_dir, args.layers, args.hidden, args.intermediate, args.vocab, args.shard)
            with open(counted, "w", encoding="utf-8") as fh:
                json.dump(count, fh)
        with open(counted, encoding="utf-8") as fh:
            count = json.load(fh)
        fp32 = count * 4
        shards = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
        print(f"{count:,} parameters, fp32 {_gib(fp32)} in {len(shards)} shard(s); {args.nproc} ranks", flush=True)
        log = os.path.join(root, "records.jsonl")
        if os.path.exists(log):  # (a kept directory's earlier run)
            os.remove(log)
        results = []
        for stage in (int(s) for s in args.stages.split(",")):
            for r in run_stage(model_dir, stage, args.nproc, log, args.lora):
                results.append(r | {"fp32_bytes": fp32})
                print(
                    f"ZeRO-{stage} rank {r['rank']}: load peak {_gib(r['load_peak'])} "
                    f"({r['load_peak'] / fp32:.2f}x fp32), load growth {_gib(r['load_growth'])} "
                    f"({r['load_growth'] / fp32:.2f}x; after loading anon {_gib(r['loaded_anon'])}, "
                    f"file {_gib(r['loaded_file'])}), whole run {_gib(r['run_peak'])} "
                    f"({r['run_peak'] / fp32:.2f}x; at the end anon {_gib(r['run_anon'])}, file "
                    f"{_gib(r['run_file'])}), loss {r['loss']:.4f}",
                    flush=True,
                )
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(results, fh, indent=2)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
