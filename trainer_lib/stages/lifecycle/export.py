"""``posttrain export``: ONNX FP32 decoder with a KV cache, FP16, INT8 (and INT4) copies, parity report.

    posttrain export model_path=out/dpo/final output_dir=out/onnx [int4=true] [fp16=false]

Writes under ``output_dir``::

    onnx/fp32/model.onnx (+ model.onnx.data)   decoder graph, see trainer_lib/export/onnx_decoder.py
    onnx/fp16/model.onnx (+ model.onnx.data)   fp16 weights and cache (fp16=true, the default): exported
                                               in half precision on a CUDA machine, else converted from
                                               FP32 (trainer_lib/export/fp16.py)
    onnx/int8/model.onnx (+ model.onnx.data)   8-bit block weights (quantize.embeddings: the embedding too,
                                               shared with a tied LM head)
    onnx/int4/model.onnx (+ model.onnx.data)   with int4=true: 4-bit MatMulNBits weights, 8-bit embedding
    tokenizer/                                 the tokenizer's save_pretrained files
    parity.json                                every figure of trainer_lib/export/parity.py per variant
    export.json                                the summary this stage returns; written last

The stage fails (exit code 2) when the FP32 graph's logits differ from PyTorch's by more than
``parity.fp32_max_abs_diff``: every other variant is made from it. A variant whose top-1 agreement
with PyTorch is under its minimum (``parity.int8_min_top1_agreement``, ``fp16_...``, ``int4_...``) is
measured, reported in ``parity.json`` and left out: ``export.json`` lists the variants written
(``models``) and those that did not hold (``failed``, with the figure), and a deploy of a variant left
out stops naming it (``variant=auto`` takes the smallest that held and a CPU serves:
:func:`trainer_lib.export.variants.pick`).
Everything is built in a temporary directory and published only after the checks, so a failed export
leaves ``output_dir`` as it was; a consumer waiting for ``export.json`` never sees a half-written export.

Memory: one copy of the weights at a time. PyTorch's side of every parity figure is computed
right after the FP32 export and the model is freed before any onnxruntime session opens; then
each variant is built (from the FP32 files, a slice of the weights at a time) and measured in its
own session, closed before the next. Progress goes to stderr as ``export: ...`` lines.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
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

#: each variant's minimum top-1 agreement with PyTorch (a ParityConfig key); FP32's check is its logits
MINIMUMS = {"int8": "int8_min_top1_agreement", "fp16": "fp16_min_top1_agreement", "int4": "int4_min_top1_agreement"}


@dataclass
class ParityConfig:
    prompts: str | None = opt(None, "JSONL of eval prompts ('prompt' or 'messages'), local or URL; default: built-in.")
    num_prompts: int = opt(8, "Use the first N prompts.")
    with_answers: bool = opt(
        False, "Keep the last assistant turn of 'messages' rows: the answers' positions are compared too."
    )
    max_new_tokens: int = opt(16, "Greedy generation length for the exact-match check.")
    fp32_max_abs_diff: float = opt(1e-3, "Fail when FP32's max |logit diff| from PyTorch exceeds this.")
    int8_min_top1_agreement: float = opt(0.95, "Leave INT8 out when its top-1 agreement with PyTorch is below this.")
    fp16_min_top1_agreement: float = opt(0.95, "Leave FP16 out when its top-1 agreement with PyTorch is below this.")
    int4_min_top1_agreement: float = opt(0.85, "Leave INT4 out when its top-1 agreement with PyTorch is below this.")
    latency_tokens: int = opt(32, "Decode steps timed per model for the latency figures (batch 1).")
    threads: int = opt(1, "CPU threads for PyTorch and onnxruntime in the latency run (0: their defaults).")


@dataclass
class QuantizeConfig:
    embeddings: bool = opt(True, "Also quantize the embedding (Gather) in INT8, most of a small model's weights.")
    int4_block_size: int = opt(32, "INT4 quantization block size (input channels per scale).", (16, 32, 64, 128, 256))
    int4_method: str = opt(
        "rtn",
        "INT4 weights by round-to-nearest (int8 dot products: fast) or hqq (float zero points fitted to the "
        "weights: closer to FP32, but onnxruntime's CPU kernels run it slower than FP32).",
        ("rtn", "hqq"),
    )


@dataclass
class ExportConfig:
    model_path: str | None = opt(None, "HF causal-LM directory to export (local or a URL such as s3://; LoRA merged).")
    output_dir: str | None = opt(None, "Where onnx/, tokenizer/, parity.json and export.json go (local or URL).")
    int4: bool = opt(False, "Also build an INT4 (MatMulNBits, weight-only) model.")
    fp16: bool = opt(
        True, "Also build an FP16 model (for GPU serving): half precision on CUDA when there is one, else converted."
    )
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
        for key in MINIMUMS.values():
            if not 0 <= getattr(self.parity, key) <= 1:
                raise ConfigError(f"parity.{key}: expected 0 <= x <= 1, got {getattr(self.parity, key)}")


CONFIG = ExportConfig


def run(cfg: ExportConfig) -> dict:
    from trainer_lib.models.load import resolve_model_path

    try:
        model_dir = resolve_model_path(cfg.model_path, key="model_path")
    except FileNotFoundError:  # an s3:// prefix with nothing under it
        raise UserError(f"model_path: {cfg.model_path} does not exist") from None
    if os.path.isdir(model_dir) and not os.path.exists(os.path.join(model_dir, "config.json")):
        raise UserError(f"model_path: {cfg.model_path} has no config.json; expected a Hugging Face model directory")
    from trainer_lib.models.vision import source_is_vision_language

    if source_is_vision_language(model_dir):  # the ONNX decoder graph has no vision tower or pixel inputs
        raise UserError(
            f"model_path: {cfg.model_path} is a vision-language model; export builds text-only ONNX decoders, "
            "and exporting or serving multimodal models is not supported yet (docs/multimodal.md)"
        )
    tokenizer = _load_tokenizer(model_dir, cfg.model_path)
    prompts = _prompt_ids(cfg.parity, tokenizer)

    local_out = None if storage.is_remote(cfg.output_dir) else os.path.abspath(os.path.expanduser(cfg.output_dir))
    parent = os.path.dirname(local_out) if local_out else storage.cache_root()
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".export-", dir=parent)  # beside output_dir, so publishing is a rename
    try:
        summary = _build(cfg, model_dir, tokenizer, prompts, work)
        _publish(work, cfg.output_dir, local_out, summary)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def _load_tokenizer(model_dir: str, source: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise _not_loaded(source, exc) from None


def _load_model(model_dir: str, source: str):
    """The model in fp32, loaded only where it is used (see _from_torch), so that it can be freed."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    except (OSError, ValueError) as exc:
        raise _not_loaded(source, exc) from None


def _not_loaded(source: str, exc: Exception) -> UserError:
    return UserError(f"model_path: could not load a causal LM and tokenizer from {source}: {exc}")


def _prompt_ids(parity: ParityConfig, tokenizer) -> list[list[int]]:
    from trainer_lib.data.preference_batches import encode_prompt

    prompts = DEFAULT_PROMPTS
    if parity.prompts:
        prompts = _read_prompts(parity.prompts, parity.with_answers)
    prompts = prompts[: parity.num_prompts]
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    if not ids or any(not row for row in ids):
        raise UserError(
            f"parity.prompts: every prompt must encode to at least one token ({parity.prompts or 'built-in prompts'})"
        )
    return ids


def _read_prompts(path: str, with_answers: bool = False) -> list:
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
            messages = row["messages"]  # the conversation up to its last assistant turn, or with it
            if is_conversational(messages) and messages[-1]["role"] == "assistant" and not with_answers:
                messages = messages[:-1]
            if not is_conversational(messages):
                raise DataError(where, "messages", "a list of chat messages with a turn before the answer", messages)
            prompts.append(messages)
        else:
            raise DataError(where, "prompt", "a 'prompt' (text or chat messages) or 'messages' field")
    if not prompts:
        raise UserError(f"parity.prompts: {path} has no prompts")
    return prompts


@dataclass
class Reference:
    """PyTorch's side of every parity figure, computed once before the model is freed."""

    logits: object  # parity.ReferenceLogits
    greedy: list[list[int]]
    latency: dict
    layout: dict
    eos: object
    pad: int
    fp16_source: str | None  # how the FP16 model was made, when it was exported from PyTorch


def _progress(what: str, start: float) -> None:
    print(f"export: {what} ({time.time() - start:.0f} s)", file=sys.stderr, flush=True)  # stdout: the summary


def _build(cfg: ExportConfig, model_dir: str, tokenizer, prompts: list[list[int]], work: str) -> dict:
    """Export and measure PyTorch, then build, measure and check each variant in turn; all files
    go under ``work``."""
    from trainer_lib.export.fp16 import convert_fp16
    from trainer_lib.export.quantize import quantize_int4, quantize_int8

    start = time.time()
    names = ("fp32", *(("fp16",) if cfg.fp16 else ()), "int8", *(("int4",) if cfg.int4 else ()))
    dirs = {name: os.path.join(work, "onnx", name) for name in names}
    reference = _from_torch(cfg, model_dir, tokenizer, prompts, dirs, start)
    gc.collect()  # the model's last references went with _from_torch
    fp32_path = os.path.join(dirs["fp32"], "model.onnx")
    build = {
        "int8": lambda out: quantize_int8(fp32_path, out, embeddings=cfg.quantize.embeddings),
        "int4": lambda out: quantize_int4(
            fp32_path, out, cfg.quantize.int4_block_size, cfg.quantize.int4_method, cfg.quantize.embeddings
        ),
        "fp16": lambda out: convert_fp16(fp32_path, out),
    }
    report, failed = {"pytorch": reference.latency}, {}
    for name in names:
        if not os.path.exists(os.path.join(dirs[name], "model.onnx")):  # (FP32, and FP16 on CUDA: from PyTorch)
            _progress(f"building {name}", start)
            build[name](os.path.join(dirs[name], "model.onnx"))
        _progress(f"checking {name}", start)
        report[name] = _measure(cfg.parity, dirs[name], reference, prompts, _providers(name))
        report[name].update(_sizes(dirs[name], dirs["fp32"]))
        reason = _check(cfg, name, report[name])
        report[name]["written"] = reason is None
        if reason:  # measured and reported, not written
            _progress(f"{name} left out: {reason}", start)
            failed[name] = reason
            shutil.rmtree(dirs[name])
    report.update(
        {
            "prompts": len(prompts),
            "max_new_tokens": cfg.parity.max_new_tokens,
            "threads": cfg.parity.threads,
            "latency_tokens": cfg.parity.latency_tokens,
            "thresholds": {key: getattr(cfg.parity, key) for key in ("fp32_max_abs_diff", *MINIMUMS.values())},
        }
    )
    with open(os.path.join(work, "parity.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
    tokenizer.save_pretrained(os.path.join(work, "tokenizer"))
    _progress("done", start)
    return _summary(cfg, reference, report, failed, time.time() - start)


def _from_torch(cfg: ExportConfig, model_dir: str, tokenizer, prompts, dirs: dict, start: float) -> Reference:
    """Load the model, export FP32, compute PyTorch's figures and, on a CUDA machine, export FP16
    from the model in half precision there. The model is not kept: it is freed on return."""
    import torch

    from trainer_lib.export import parity

    _progress("loading the model", start)
    model = _load_model(model_dir, cfg.model_path)
    _progress("exporting fp32", start)
    layout = _export(cfg, model, dirs["fp32"])
    _progress("measuring pytorch", start)
    eos = model.generation_config.eos_token_id
    eos = tokenizer.eos_token_id if eos is None else eos
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    decoder = parity.TorchDecoder(model)
    logits = parity.reference_logits(decoder, prompts)
    greedy = parity.torch_greedy(model, prompts, cfg.parity.max_new_tokens, eos, pad)
    with parity.torch_threads(cfg.parity.threads):
        latency = parity.decode_latency(decoder, max(prompts, key=len), cfg.parity.latency_tokens)
    fp16_source = None
    if "fp16" in dirs and torch.cuda.is_available():
        _progress("exporting fp16 on cuda", start)
        model.to("cuda", dtype=torch.float16)  # in place: the host copy of the weights goes
        _export(cfg, model, dirs["fp16"])
        fp16_source = "torch.float16 on cuda"
        del model, decoder
        torch.cuda.empty_cache()
    return Reference(logits, greedy, latency, layout, eos, pad, fp16_source)


def _export(cfg: ExportConfig, model, directory: str) -> dict:
    from trainer_lib.export.onnx_decoder import export_decoder

    try:
        return export_decoder(model, os.path.join(directory, "model.onnx"), opset=cfg.opset)
    except Exception as exc:  # torch.export / onnxscript errors have many types; the user needs the text
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"model_path: could not export {cfg.model_path} to ONNX ({type(exc).__name__}: {first})"
        ) from exc


def _providers(name: str) -> list[str]:
    """Where a variant's parity run goes: FP16 on the GPU when both torch and onnxruntime see one."""
    import onnxruntime
    import torch

    if (
        name == "fp16"
        and torch.cuda.is_available()
        and "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    ):
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _measure(cfg: ParityConfig, directory: str, reference: Reference, prompts, providers: list[str]) -> dict:
    """Logit parity, greedy exact match and decode latency of one variant, in a session of its own
    that is closed on return."""
    from trainer_lib.export import parity
    from trainer_lib.export.ort_generate import OrtDecoder

    decoder = OrtDecoder(directory, providers=providers, threads=cfg.threads)
    figures = parity.logit_parity(reference.logits, decoder)
    figures.update(parity.greedy_parity(reference.greedy, decoder, prompts, cfg.max_new_tokens, reference.eos))
    figures.update(parity.decode_latency(decoder, max(prompts, key=len), cfg.latency_tokens))
    figures["providers"] = decoder.providers
    return figures


def _sizes(directory: str, fp32_directory: str) -> dict:
    from trainer_lib.export import parity

    files, weights = parity.directory_bytes(directory), parity.weight_bytes(directory)
    return {
        "file_bytes": files,
        "weight_bytes": weights,
        "file_ratio_vs_fp32": round(parity.directory_bytes(fp32_directory) / files, 3),
        "weight_ratio_vs_fp32": round(parity.weight_bytes(fp32_directory) / weights, 3),
    }


def _check(cfg: ExportConfig, name: str, figures: dict) -> str | None:
    """Why variant ``name`` is left out (its top-1 agreement under its minimum), or None. FP32's max logit
    diff over ``parity.fp32_max_abs_diff`` fails the export: every other variant is made from it."""
    if name == "fp32":
        worst = max(figures["prefill"]["max_abs_diff"], figures["decode"]["max_abs_diff"])
        if worst > cfg.parity.fp32_max_abs_diff:
            raise UserError(
                f"parity.fp32_max_abs_diff: the FP32 ONNX logits differ from PyTorch by up to {worst:.3g} "
                f"(limit {cfg.parity.fp32_max_abs_diff:g}); nothing was written to {cfg.output_dir}"
            )
        return None
    key = MINIMUMS[name]
    minimum = getattr(cfg.parity, key)
    if figures["top1_agreement"] < minimum:
        return f"parity.{key}: top-1 agreement with PyTorch {figures['top1_agreement']:.3f} < {minimum:g}"
    return None


def _summary(cfg: ExportConfig, reference: Reference, report: dict, failed: dict, seconds: float) -> dict:
    import onnxruntime
    import torch
    import transformers

    variants = [name for name in ("fp32", "fp16", "int8", "int4") if name in report and name not in failed]
    worst = {
        name: max(report[name]["prefill"]["max_abs_diff"], report[name]["decode"]["max_abs_diff"]) for name in variants
    }
    fp16 = {"fp16_source": reference.fp16_source or "converted from fp32 (trainer_lib/export/fp16.py)"}
    return {
        "stage": "export",
        "model_path": cfg.model_path,
        "output_dir": cfg.output_dir,
        "models": {name: f"onnx/{name}/model.onnx" for name in variants},
        "failed": failed,
        "cache_dtype": {name: "float16" if name == "fp16" else "float32" for name in variants},
        **(fp16 if "fp16" in variants else {}),
        "tokenizer": "tokenizer",
        "parity": "parity.json",
        "eos_token_id": reference.eos,
        "pad_token_id": reference.pad,
        **reference.layout,
        "fp32_max_abs_diff": worst["fp32"],
        "max_abs_diff": worst,
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
