"""``posttrain export``: ONNX FP32 decoder with a KV cache, INT8 (and INT4) copies, parity report.

    posttrain export model_path=out/dpo/final output_dir=out/onnx [int4=true]

Writes under ``output_dir``::

    onnx/fp32/model.onnx (+ model.onnx.data)   decoder graph, see trainer_lib/export/onnx_decoder.py
    onnx/int8/model.onnx (+ model.onnx.data)   int8 weights (quantize.embeddings: Gather too)
    onnx/int4/model.onnx (+ model.onnx.data)   with int4=true: 4-bit MatMulNBits weights
    tokenizer/                                 the tokenizer's save_pretrained files
    parity.json                                every figure of trainer_lib/export/parity.py per variant
    export.json                                the summary this stage returns; written last

The stage fails (exit code 2) when the FP32 graph's logits differ from PyTorch's by more than
``parity.fp32_max_abs_diff`` or INT8 top-1 agreement is under ``parity.int8_min_top1_agreement``.
Everything is built in a temporary directory and published only after the checks pass, so a
failed export leaves ``output_dir`` as it was; a consumer waiting for ``export.json`` never
sees a half-written export.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import StorageConfig, opt
from trainer_lib.errors import ConfigError, DataError, UserError

DEFAULT_PROMPTS = [
    "What is two plus two?",
    "Name a color.",
    "Say hello.",
    "Write a Python function add_one(x).",
    "Is the sky green?",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
]


@dataclass
class ParityConfig:
    prompts: str | None = opt(None, "JSONL of eval prompts ('prompt' or 'messages'), local or URL; default: built-in.")
    num_prompts: int = opt(8, "Use the first N prompts.")
    max_new_tokens: int = opt(16, "Greedy generation length for the exact-match check.")
    fp32_max_abs_diff: float = opt(1e-3, "Fail when FP32's max |logit diff| from PyTorch exceeds this.")
    int8_min_top1_agreement: float = opt(0.9, "Fail when INT8's top-1 agreement with PyTorch is below this (0: off).")
    latency_tokens: int = opt(32, "Decode steps timed per model for the latency figures (batch 1).")
    threads: int = opt(1, "CPU threads for PyTorch and onnxruntime in the latency run (0: their defaults).")


@dataclass
class QuantizeConfig:
    embeddings: bool = opt(True, "Also quantize the embedding (Gather) in INT8, most of a small model's weights.")
    int4_block_size: int = opt(32, "INT4 quantization block size (input channels per scale).", (16, 32, 64, 128, 256))


@dataclass
class ExportConfig:
    model_path: str | None = opt(None, "HF causal-LM directory to export (local or a URL such as s3://; LoRA merged).")
    output_dir: str | None = opt(None, "Where onnx/, tokenizer/, parity.json and export.json go (local or URL).")
    int4: bool = opt(False, "Also build an INT4 (MatMulNBits, weight-only) model.")
    opset: int = opt(18, "ONNX opset of the exported graph (the dynamo exporter emits 18 or newer).")
    parity: ParityConfig = opt(ParityConfig, "Parity and latency checks against PyTorch.")
    quantize: QuantizeConfig = opt(QuantizeConfig, "Quantization settings.")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        for key in ("model_path", "output_dir"):
            if not getattr(self, key):
                raise ConfigError(f"{key}: required")
        if self.opset < 18:
            raise ConfigError(f"opset: expected 18 or newer, got {self.opset}")
        for key in ("num_prompts", "max_new_tokens", "latency_tokens"):
            if getattr(self.parity, key) < 1:
                raise ConfigError(f"parity.{key}: expected a positive integer, got {getattr(self.parity, key)}")
        if self.parity.threads < 0:
            raise ConfigError(f"parity.threads: expected >= 0, got {self.parity.threads}")
        if not self.parity.fp32_max_abs_diff >= 0:
            raise ConfigError(f"parity.fp32_max_abs_diff: expected >= 0, got {self.parity.fp32_max_abs_diff}")
        if not 0 <= self.parity.int8_min_top1_agreement <= 1:
            raise ConfigError(
                f"parity.int8_min_top1_agreement: expected 0 <= x <= 1, got {self.parity.int8_min_top1_agreement}"
            )


CONFIG = ExportConfig


def run(cfg: ExportConfig) -> dict:
    from trainer_lib.models.load import resolve_model_path

    try:
        model_dir = resolve_model_path(cfg.model_path, key="model_path")
    except FileNotFoundError:  # an s3:// prefix with nothing under it
        raise UserError(f"model_path: {cfg.model_path} does not exist") from None
    if os.path.isdir(model_dir) and not os.path.exists(os.path.join(model_dir, "config.json")):
        raise UserError(f"model_path: {cfg.model_path} has no config.json; expected a Hugging Face model directory")
    model, tokenizer = _load(model_dir, cfg.model_path)
    prompts = _prompt_ids(cfg.parity, tokenizer)

    local_out = None if storage.is_remote(cfg.output_dir) else os.path.abspath(os.path.expanduser(cfg.output_dir))
    parent = os.path.dirname(local_out) if local_out else storage.cache_root()
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".export-", dir=parent)  # beside output_dir, so publishing is a rename
    try:
        summary = _build(cfg, model, tokenizer, prompts, work)
        _publish(work, cfg.output_dir, local_out, summary)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def _load(model_dir: str, source: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise UserError(f"model_path: could not load a causal LM and tokenizer from {source}: {exc}") from None
    return model.eval(), tokenizer


def _prompt_ids(parity: ParityConfig, tokenizer) -> list[list[int]]:
    from trainer_lib.data.preference_batches import encode_prompt

    prompts = DEFAULT_PROMPTS
    if parity.prompts:
        prompts = _read_prompts(parity.prompts)
    prompts = prompts[: parity.num_prompts]
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    if not ids or any(not row for row in ids):
        raise UserError(
            f"parity.prompts: every prompt must encode to at least one token ({parity.prompts or 'built-in prompts'})"
        )
    return ids


def _read_prompts(path: str) -> list:
    from trainer_lib.data.formats import is_conversational

    try:
        lines = storage.read_text(path).splitlines()
    except FileNotFoundError:
        raise UserError(f"parity.prompts: {path} does not exist") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except ValueError:
            raise DataError(where, None, "a JSON object per line") from None
        if not isinstance(row, dict):
            raise DataError(where, None, "a JSON object", row)
        if "prompt" in row:
            if not (isinstance(row["prompt"], str) or is_conversational(row["prompt"])):
                raise DataError(where, "prompt", "text or a list of chat messages", row["prompt"])
            prompts.append(row["prompt"])
        elif "messages" in row:
            messages = row["messages"]  # the conversation up to its last assistant turn
            if is_conversational(messages) and messages[-1]["role"] == "assistant":
                messages = messages[:-1]
            if not is_conversational(messages):
                raise DataError(where, "messages", "a list of chat messages with a turn before the answer", messages)
            prompts.append(messages)
        else:
            raise DataError(where, "prompt", "a 'prompt' (text or chat messages) or 'messages' field")
    if not prompts:
        raise UserError(f"parity.prompts: {path} has no prompts")
    return prompts


def _build(cfg: ExportConfig, model, tokenizer, prompts: list[list[int]], work: str) -> dict:
    """Export, check FP32, quantize, measure everything, check INT8; all files go under ``work``."""
    from trainer_lib.export import parity
    from trainer_lib.export.onnx_decoder import export_decoder
    from trainer_lib.export.ort_generate import OrtDecoder
    from trainer_lib.export.quantize import quantize_int4, quantize_int8

    start = time.time()
    dirs = {name: os.path.join(work, "onnx", name) for name in ("fp32", "int8", *(("int4",) if cfg.int4 else ()))}
    try:
        layout = export_decoder(model, os.path.join(dirs["fp32"], "model.onnx"), opset=cfg.opset)
    except Exception as exc:  # torch.export / onnxscript errors have many types; the user needs the text
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"model_path: could not export {cfg.model_path} to ONNX ({type(exc).__name__}: {first})"
        ) from exc
    reference = parity.TorchDecoder(model)
    decoders = {"fp32": OrtDecoder(dirs["fp32"], threads=cfg.parity.threads)}
    report = {"fp32": parity.logit_parity(reference, decoders["fp32"], prompts)}
    worst = max(report["fp32"]["prefill"]["max_abs_diff"], report["fp32"]["decode"]["max_abs_diff"])
    if worst > cfg.parity.fp32_max_abs_diff:
        raise UserError(
            f"parity.fp32_max_abs_diff: the FP32 ONNX logits differ from PyTorch by up to {worst:.3g} "
            f"(limit {cfg.parity.fp32_max_abs_diff:g}); nothing was written to {cfg.output_dir}"
        )

    fp32_path = os.path.join(dirs["fp32"], "model.onnx")
    quantize_int8(fp32_path, os.path.join(dirs["int8"], "model.onnx"), embeddings=cfg.quantize.embeddings)
    if cfg.int4:
        quantize_int4(fp32_path, os.path.join(dirs["int4"], "model.onnx"), block_size=cfg.quantize.int4_block_size)
    for name in dirs:
        if name != "fp32":
            decoders[name] = OrtDecoder(dirs[name], threads=cfg.parity.threads)
            report[name] = parity.logit_parity(reference, decoders[name], prompts)
    eos = model.generation_config.eos_token_id
    eos = tokenizer.eos_token_id if eos is None else eos
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    _measure(cfg.parity, model, reference, decoders, dirs, prompts, eos, pad, report)

    agreement = report["int8"]["top1_agreement"]
    if agreement < cfg.parity.int8_min_top1_agreement:
        raise UserError(
            f"parity.int8_min_top1_agreement: INT8 top-1 agreement with PyTorch is {agreement:.3f} "
            f"(minimum {cfg.parity.int8_min_top1_agreement:g}); nothing was written to {cfg.output_dir}"
        )
    with open(os.path.join(work, "parity.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
    tokenizer.save_pretrained(os.path.join(work, "tokenizer"))
    return _summary(cfg, layout, report, eos, pad, time.time() - start)


def _measure(
    cfg: ParityConfig,
    model,
    reference,
    decoders: dict,
    dirs: dict,
    prompts: list[list[int]],
    eos,
    pad: int,
    report: dict,
) -> None:
    """Add greedy exact match, sizes and decode latency of every variant (and PyTorch's) to ``report``."""
    from trainer_lib.export import parity

    expected = parity.torch_greedy(model, prompts, cfg.max_new_tokens, eos, pad)
    fp32_files, fp32_weights = parity.directory_bytes(dirs["fp32"]), parity.weight_bytes(dirs["fp32"])
    for name, decoder in decoders.items():
        report[name].update(parity.greedy_parity(expected, decoder, prompts, cfg.max_new_tokens, eos))
        files, weights = parity.directory_bytes(dirs[name]), parity.weight_bytes(dirs[name])
        report[name].update(
            {
                "file_bytes": files,
                "weight_bytes": weights,
                "file_ratio_vs_fp32": round(fp32_files / files, 3),
                "weight_ratio_vs_fp32": round(fp32_weights / weights, 3),
            }
        )
    latency_prompt = max(prompts, key=len)
    with parity.torch_threads(cfg.threads):
        report["pytorch"] = parity.decode_latency(reference, latency_prompt, cfg.latency_tokens)
    for name, decoder in decoders.items():
        report[name].update(parity.decode_latency(decoder, latency_prompt, cfg.latency_tokens))
    report.update(
        {
            "prompts": len(prompts),
            "max_new_tokens": cfg.max_new_tokens,
            "threads": cfg.threads,
            "latency_tokens": cfg.latency_tokens,
            "thresholds": {
                "fp32_max_abs_diff": cfg.fp32_max_abs_diff,
                "int8_min_top1_agreement": cfg.int8_min_top1_agreement,
            },
        }
    )


def _summary(cfg: ExportConfig, layout: dict, report: dict, eos, pad: int, seconds: float) -> dict:
    import onnxruntime
    import torch
    import transformers

    variants = [name for name in ("fp32", "int8", "int4") if name in report]
    return {
        "stage": "export",
        "model_path": cfg.model_path,
        "output_dir": cfg.output_dir,
        "models": {name: f"onnx/{name}/model.onnx" for name in variants},
        "tokenizer": "tokenizer",
        "parity": "parity.json",
        "eos_token_id": eos,
        "pad_token_id": pad,
        **layout,
        "fp32_max_abs_diff": max(report["fp32"]["prefill"]["max_abs_diff"], report["fp32"]["decode"]["max_abs_diff"]),
        "top1_agreement": {name: report[name]["top1_agreement"] for name in variants},
        "greedy_exact_match": {name: report[name]["greedy_exact_match"] for name in variants},
        "file_bytes": {name: report[name]["file_bytes"] for name in variants},
        "weight_bytes": {name: report[name]["weight_bytes"] for name in variants},
        "decode_ms_per_token": {
            "pytorch": report["pytorch"]["decode_ms_per_token"],
            **{name: report[name]["decode_ms_per_token"] for name in variants},
        },
        "exporter": "torch.onnx.export(dynamo=True)",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        "seconds": round(seconds, 1),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _publish(work: str, output_dir: str, local_out: str | None, summary: dict) -> None:
    """Move the checked export into ``output_dir``, replacing only this stage's own entries;
    ``export.json`` goes last (and a previous one first), so it marks a complete export."""
    entries = ["onnx", "tokenizer", "parity.json"]
    marker = storage.join(output_dir, "export.json")
    if storage.exists(marker):
        storage.delete(marker)
    if local_out is None:
        for name in entries:
            storage.delete(storage.join(output_dir, name))
            storage.copy(os.path.join(work, name), storage.join(output_dir, name))
    else:
        os.makedirs(local_out, exist_ok=True)
        for name in entries:
            storage.delete(os.path.join(local_out, name))
            os.replace(os.path.join(work, name), os.path.join(local_out, name))
    storage.write_text(marker, json.dumps(summary, indent=2))
