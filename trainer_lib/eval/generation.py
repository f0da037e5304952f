"""One generation interface for evaluation, three engines behind it, and prompts shared out across ranks.

An engine turns prompts (token ids) into completion texts, ``n`` consecutive ones per prompt, each cut
at its first eos or stop string exactly as :mod:`trainer_lib.rl.rollout` cuts them
(:func:`~trainer_lib.rl.rollout.cut_completion`)::

    engine.generate(prompt_ids, n=1, max_new_tokens=64, temperature=0.0, top_p=1.0, stop=(), seed=0)
        -> list[str]                  temperature 0 is greedy
    engine.tokenizer                  the Hugging Face tokenizer the prompts are encoded with
    engine.collective                 True when a generate call is a collective every rank makes (ZeRO-3)
    engine.close()                    frees the model

The engines:

* ``torch`` (:class:`TorchEngine`): the model's own ``generate`` through ``rollout.generate``, the
  path the RL stages sample with; a model partitioned with ZeRO-3 generates with ``synced_gpus``.
* ``onnx`` (:class:`OnnxEngine`): an exported variant through ``OrtDecoder``, the loop the Triton
  server runs, with the export's tokenizer, eos and pad ids. Like the server it samples from
  ``softmax(logits / temperature)`` with no top-p cut.
* ``vllm`` (:class:`VllmEngine`): vLLM in bf16 with tensor parallelism over the process's GPUs, when
  ``vllm`` is importable and CUDA is there (:func:`choose_engine`); it is never imported otherwise.

:func:`generate_sharded` is how evaluation calls an engine, on one rank or many: the ``n`` copies of
every prompt are cut into batches of ``batch_size`` sequences (the same batches however many ranks
there are), batch ``i`` is sampled with :func:`batch_seed` ``(seed, i)`` and computed by rank
``i % world_size``, and the texts are merged back into order on every rank. Each batch is computed
as one process would compute it, so N ranks give the one-process texts exactly.
"""

from __future__ import annotations

import hashlib
import os
from typing import Protocol

from trainer_lib import storage
from trainer_lib.errors import ConfigError

ENGINES = ("auto", "torch", "vllm")


class Engine(Protocol):
    name: str
    tokenizer: object
    collective: bool

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        n: int = 1,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: tuple | list = (),
        seed: int = 0,
    ) -> list[str]: ...

    def close(self) -> None: ...


def batch_seed(seed: int, index: int) -> int:
    """The sampling seed of batch ``index``: ``seed`` itself for the first batch (so a run that fits in
    one batch samples what it sampled before batches had seeds), then a hash of both."""
    if index == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # (torch and numpy take any non-negative int64)


# --------------------------------------------------------------------------- sharding


def generate_sharded(
    engine: Engine,
    prompt_ids: list[list[int]],
    *,
    batch_size: int,
    n: int = 1,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    stop: tuple | list = (),
    seed: int = 0,
    strategy=None,
) -> list[str]:
    """``n`` completions per prompt (consecutive), the batches shared out across ``strategy``'s ranks
    (see the module docstring); ``strategy`` None is one process. Every rank returns every text.

    When a generate call is a collective (``engine.collective``) every rank makes the same number of
    calls: a rank short of batches repeats the first one and drops its texts."""
    sequences = [list(ids) for ids in prompt_ids for _ in range(n)]
    if not sequences:  # (every rank has the same prompts, so all return here together)
        return []
    batches = [sequences[start : start + batch_size] for start in range(0, len(sequences), batch_size)]
    rank, world = (strategy.rank, strategy.world_size) if strategy is not None else (0, 1)
    mine = list(range(rank, len(batches), world))
    calls = -(-len(batches) // world) if engine.collective else len(mine)
    texts: dict[int, str] = {}
    for call in range(calls):
        index = mine[call] if call < len(mine) else None
        batch = batches[0 if index is None else index]
        out = engine.generate(
            batch,
            n=1,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=stop,
            seed=batch_seed(seed, 0 if index is None else index),
        )
        if index is not None:
            texts.update(zip(range(index * batch_size, index * batch_size + len(batch)), out))
    if world == 1:
        return [texts[i] for i in range(len(sequences))]
    return merge_texts(strategy, texts, len(sequences))


def merge_texts(strategy, texts: dict[int, str], count: int) -> list[str]:
    """The texts of every rank (position -> text, each position on one rank) in order, on every rank.

    Each rank writes its own positions into zeros and a sum across ranks assembles the whole: first the
    UTF-8 lengths, then the bytes (two all-reduces through the strategy)."""
    import torch

    encoded = {i: text.encode("utf-8") for i, text in texts.items()}
    lengths = torch.zeros(count, dtype=torch.int64)
    for i, data in encoded.items():
        lengths[i] = len(data)
    lengths = strategy.all_reduce(lengths, op="sum").cpu()
    ends = lengths.cumsum(0).tolist()
    starts = [end - length for end, length in zip(ends, lengths.tolist())]
    total = ends[-1] if ends else 0
    if not total:
        return [""] * count
    buffer = torch.zeros(total, dtype=torch.uint8)
    for i, data in encoded.items():
        if data:
            buffer[starts[i] : ends[i]] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    raw = strategy.all_reduce(buffer, op="sum").cpu().numpy().tobytes()
    return [raw[start:end].decode("utf-8") for start, end in zip(starts, ends)]


# --------------------------------------------------------------------------- torch


class TorchEngine:
    """A Hugging Face causal LM (whole, or partitioned with ZeRO-3) through ``rollout.generate``."""

    name = "torch"

    def __init__(self, model, tokenizer, collective: bool = False, owner=None):
        self.model, self.tokenizer, self.collective = model, tokenizer, collective
        self.owner = owner  # the DeepSpeed engine around a partitioned model, destroyed on close

    def generate(self, prompt_ids, *, n=1, max_new_tokens=64, temperature=0.0, top_p=1.0, stop=(), seed=0):
        from trainer_lib.rl.rollout import generate

        if not prompt_ids:
            return []
        return generate(
            self.model,
            self.tokenizer,
            prompt_ids,
            n=n,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=list(stop),
            batch_size=len(prompt_ids) * n,  # one call is one batch: generate_sharded made it
            seed=seed,
            synced_gpus=self.collective,
        ).completions

    def close(self) -> None:
        import torch

        if self.owner is not None:
            self.owner.destroy()
        self.model = self.owner = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def load_torch_engine(
    path: str, precision: str, device: str, trust_remote_code: bool = False, strategy=None
) -> TorchEngine:
    """The causal LM at ``path`` in ``precision``: whole on ``device``, or, when ``strategy`` partitions
    parameters (ZeRO-3), built partitioned across its ranks and wrapped for inference."""
    from trainer_lib.config import ModelConfig
    from trainer_lib.models.load import Placement, load_causal_lm, load_tokenizer

    model_cfg = ModelConfig(path=path, trust_remote_code=trust_remote_code)
    tokenizer = load_tokenizer(model_cfg)
    if strategy is not None and strategy.partitions_parameters:
        model = load_causal_lm(model_cfg, precision, placement=strategy.placement(train=False))
        owner = strategy.prepare_frozen(model)
        return TorchEngine(strategy.unwrap(owner), tokenizer, collective=strategy.world_size > 1, owner=owner)
    placement = None if str(device) == "cpu" else Placement(device=str(device))  # straight onto the accelerator
    model = load_causal_lm(model_cfg, precision, placement=placement).to(device).eval()
    return TorchEngine(model, tokenizer)


# --------------------------------------------------------------------------- onnx (what is served)


class OnnxEngine:
    """An exported decoder variant through ``OrtDecoder``: the served model's own generation loop."""

    name = "onnx"
    collective = False

    def __init__(self, decoder, tokenizer, eos_ids: list[int], pad_id: int):
        self.decoder, self.tokenizer, self.eos_ids, self.pad_id = decoder, tokenizer, eos_ids, pad_id

    def generate(self, prompt_ids, *, n=1, max_new_tokens=64, temperature=0.0, top_p=1.0, stop=(), seed=0):
        from trainer_lib.rl.rollout import cut_completion

        sequences = [list(ids) for ids in prompt_ids for _ in range(n)]
        if not sequences:
            return []
        # top_p is not applied: the served loop samples from softmax(logits / temperature) alone
        new = self.decoder.generate(
            sequences,
            max_new_tokens,
            eos_token_id=self.eos_ids or None,
            temperature=temperature,
            seed=seed,
            pad_token_id=self.pad_id,
        )
        return [cut_completion(self.tokenizer, row, stop, self.eos_ids)[1] for row in new]

    def close(self) -> None:
        self.decoder = None


def read_export(export_dir: str, variant: str, key: str = "served") -> dict:
    """An export stage's ``export.json``, checked to list ``variant`` (a written one, not ``auto``: see
    :func:`trainer_lib.export.variants.resolve`); errors name ``<key>.export_dir`` and ``<key>.variant``."""
    from trainer_lib.export.variants import pick, read_summary

    summary = read_summary(export_dir, f"{key}.export_dir")
    pick(summary, variant, f"{key}.variant")
    return summary


def load_onnx_engine(export_dir: str, variant: str, device: str = "cpu", key: str = "served") -> OnnxEngine:
    """``variant`` of the export in ``export_dir`` (local or URL) on onnxruntime: the CUDA provider on a GPU
    ``device`` when onnxruntime has it, else the CPU; the export's tokenizer, eos and pad ids."""
    import onnxruntime
    from transformers import AutoTokenizer

    from trainer_lib.export.ort_generate import OrtDecoder

    summary = read_export(export_dir, variant, key)
    folder, _, model_file = summary["models"][variant].rpartition("/")  # onnx/<variant>/model.onnx
    model_dir = storage.localize(storage.join(export_dir, folder), kind="dir")  # that variant's files only
    tokenizer_dir = storage.localize(storage.join(export_dir, summary.get("tokenizer") or "tokenizer"), kind="dir")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = summary.get("eos_token_id")
    eos = tokenizer.eos_token_id if eos is None else eos
    eos_ids = [int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None]
    pad = summary.get("pad_token_id")
    pad = tokenizer.pad_token_id if pad is None else pad
    providers = None
    if str(device).startswith("cuda") and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        index = int(str(device).partition(":")[2] or 0)
        providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    decoder = OrtDecoder(os.path.join(model_dir, model_file), providers=providers)
    return OnnxEngine(decoder, tokenizer, eos_ids, int(pad or 0))


# --------------------------------------------------------------------------- vllm (optional)


def vllm_usable() -> bool:
    """vLLM is installed and a CUDA GPU is visible (checked without importing vllm)."""
    import importlib.util

    import torch

    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def choose_engine(requested: str, world_size: int = 1, placement: str = "replica") -> str:
    """``torch`` or ``vllm`` for ``engine=auto|torch|vllm``: auto is vLLM when it is usable (installed,
    CUDA, one process holding whole models), else torch. vLLM spreads one process over all its GPUs
    with tensor parallelism, so it does not run under ``--nproc`` or ``placement=zero3``."""
    alone = world_size == 1 and placement == "replica"
    if requested == "vllm":
        if not vllm_usable():
            raise ConfigError("engine: vllm needs the vllm package and a CUDA GPU; use engine=torch (or auto)")
        if not alone:
            raise ConfigError(
                "engine: vllm runs as one process over all its GPUs (tensor parallel); "
                "drop --nproc and placement=zero3, or use engine=torch"
            )
        return "vllm"
    return "vllm" if requested == "auto" and alone and vllm_usable() else "torch"


class VllmEngine:
    """vLLM over the model at ``path``: bf16 (or fp32), tensor parallel over every GPU this process sees.
    Each sequence is its own request with its own seed; the texts are cut by rollout's rules from
    the generated token ids."""

    name = "vllm"
    collective = False

    def __init__(self, path: str, tokenizer, precision: str = "bf16", trust_remote_code: bool = False):
        import torch
        from vllm import LLM

        from trainer_lib.models.load import resolve_model_path

        self.tokenizer = tokenizer
        local = resolve_model_path(path)
        self.llm = LLM(
            model=local,
            dtype="bfloat16" if precision == "bf16" else "float32",
            tensor_parallel_size=torch.cuda.device_count(),
            trust_remote_code=trust_remote_code,
        )
        self.eos_ids = _eos_ids(local, tokenizer)

    def generate(self, prompt_ids, *, n=1, max_new_tokens=64, temperature=0.0, top_p=1.0, stop=(), seed=0):
        from vllm import SamplingParams

        from trainer_lib.rl.rollout import cut_completion

        sequences = [list(ids) for ids in prompt_ids for _ in range(n)]
        if not sequences:
            return []
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                max_tokens=max_new_tokens,
                stop=list(stop) or None,
                include_stop_str_in_output=True,  # the ids keep the stop string; cut_completion cuts it
                seed=batch_seed(seed, row),
            )
            for row in range(len(sequences))
        ]
        requests = [{"prompt_token_ids": ids} for ids in sequences]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [cut_completion(self.tokenizer, list(o.outputs[0].token_ids), stop, self.eos_ids)[1] for o in outputs]

    def close(self) -> None:
        import contextlib
        import gc

        import torch

        self.llm = None
        with contextlib.suppress(ImportError):
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
        gc.collect()
        torch.cuda.empty_cache()


def _eos_ids(model_dir: str, tokenizer) -> list[int]:
    """The tokenizer's eos and any the checkpoint's generation config lists (as rollout stops)."""
    from transformers import GenerationConfig

    ids = [tokenizer.eos_token_id]
    try:
        extra = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        extra = None
    ids += extra if isinstance(extra, list) else [extra]
    return list(dict.fromkeys(i for i in ids if i is not None))


def load_vllm_engine(path: str, precision: str, trust_remote_code: bool = False) -> VllmEngine:
    from trainer_lib.config import ModelConfig
    from trainer_lib.models.load import load_tokenizer

    tokenizer = load_tokenizer(ModelConfig(path=path, trust_remote_code=trust_remote_code))
    return VllmEngine(path, tokenizer, precision, trust_remote_code)
