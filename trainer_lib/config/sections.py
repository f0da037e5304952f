"""The config sections every stage composes (``model``, ``data``, ``engine``, ``lora``, ``storage``)
and :class:`TrainingConfig`, the keys every training stage shares.

Every stage declares one small dataclass; shared sections are fields, not base classes. Fields carry
their help text in ``metadata["help"]`` (:func:`opt`), so ``posttrain <stage> --help`` lists every
option. ``validate()`` raises a :class:`~trainer_lib.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import keyword
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from trainer_lib.data import chat_templates
from trainer_lib.errors import ConfigError


def opt(default: Any, help: str, choices: tuple | None = None) -> Any:
    """A dataclass field with help text (and optional allowed values)."""
    meta = {"help": help, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    if dataclasses.is_dataclass(default) and isinstance(default, type):
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


#: transformers' SchedulerType names that step once per optimizer step (a test keeps this list
#: equal to the installed transformers'), and those that need a metric instead.
SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
)
METRIC_SCHEDULERS = ("reduce_lr_on_plateau", "greedy")

#: The values of ``model.attn_implementation`` and ``data.format``.
#: the values ``report_to`` takes (``none``: metrics.jsonl only); loop/tracking.py runs them.
REPORTERS = ("tensorboard", "mlflow", "wandb", "none")
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")
DATA_FORMATS = (
    "auto",
    "text",
    "prompt_completion",
    "messages",
    "preference",
    "unpaired_preference",
    "prompt_only",
    "alpaca",
    "sharegpt",
    "hh_rlhf",
    "gsm8k",
    "mbpp",
)


@dataclass
class ModelConfig:
    path: str | None = opt(
        None,
        "Base model: HF hub id, local directory, URL (s3://, gs://, hf://...) or .gguf file (converted once).",
    )
    revision: str = opt("", "Hub revision of model.path and its tokenizer: branch, tag or commit sha; default main.")
    tokenizer_path: str | None = opt(None, "Tokenizer location if different from model.path.")
    chat_template: str = opt("", "Chat template: chatml, llama3, zephyr, Jinja text or file (empty: the tokenizer's).")
    attn_implementation: str = opt("sdpa", "Attention kernel of transformers (docs/configuration.md).", ATTENTIONS)
    trust_remote_code: bool = opt(False, "Allow custom modelling code from the model repo.")
    chunked_lm_head: bool = opt(
        True, "Log-probs and losses through the LM head a tile at a time, never all logits (docs/performance.md)."
    )


#: How rows of several datasets (``data.dataset``) are combined, as LLaMA-Factory's ``mix_strategy``.
MIX_STRATEGIES = ("concat", "interleave_under", "interleave_over")
#: What happens to rows longer than ``data.max_length``.
OVER_LENGTH = ("truncate", "drop")
#: What happens to a malformed row (``data.bad_rows``).
BAD_ROWS = ("error", "drop")


#: the keys of one entry of ``data.sources``: ``data``'s keys of the same names, for that dataset.
SOURCE_KEYS = ("path", "subset", "split", "columns", "revision")


@dataclass
class DataConfig:
    path: str | None = opt(None, "Dataset: JSONL/JSON/Parquet/CSV file, datasets dir or hub id; local or URL.")
    dataset: list[str] = opt([], "Instead of path: dataset names in dataset_dir/dataset_info.json (LLaMA-Factory's).")
    dataset_dir: str = opt("data", "Folder of dataset_info.json; the files it names are relative to it.")
    sources: list[dict] = opt(
        [], "Instead of path: several datasets, each {path, subset, split, columns, revision} (TRL's datasets)."
    )
    mix_strategy: str = opt("concat", "How several datasets are combined (docs/data-formats.md).", MIX_STRATEGIES)
    interleave_probs: list[float] = opt([], "interleave_*: the chance of drawing from each dataset; empty: in turn.")
    format: str = opt("auto", "Dataset format; auto detects it from the columns (docs/data-formats.md).", DATA_FORMATS)
    columns: dict[str, str] = opt({}, "Alpaca/sharegpt column renames, e.g. {prompt: question} (docs/data-formats.md).")
    subset: str = opt("", "Configuration of a hub dataset (load_dataset's name), e.g. main for openai/gsm8k.")
    split: str = opt("", "Split of data.path to train on; default train, else the first split.")
    eval_split: str = opt("", "Split of data.path held out for eval; default eval, validation, valid or test, if any.")
    revision: str = opt("", "Hub dataset revision: a branch, tag or commit sha; default main.")
    eval_path: str | None = opt(None, "Separate eval dataset (otherwise split off data.path).")
    eval_dataset: list[str] = opt([], "Instead of eval_path: eval dataset names in dataset_info.json.")
    eval_fraction: float = opt(0.05, "Fraction of rows held out for eval when no eval split exists.")
    eval_by: str = opt(
        "shuffle",
        "How eval rows are split off: shuffle (eval_fraction, seeded), hash (eval_fraction, by each row's "
        "content: the same rows on every machine and order) or COLUMN:RANGES, e.g. task_id:511-600.",
    )
    bad_rows: str = opt(
        "error",
        "A malformed row: error (exit 2, naming file, row and field) or drop (counted in stats.json).",
        BAD_ROWS,
    )
    max_rows: int = opt(0, "Read at most this many rows of each dataset (0: all).")
    max_length: int = opt(512, "Maximum tokens per example; longer ones: see over_length.")
    over_length: str = opt(
        "truncate",
        "Rows over max_length: truncate (SFT keeps the first max_length tokens, as TRL; DPO/reward the "
        "prompt's end and the answers' start) or drop. RL prompts are always dropped.",
        OVER_LENGTH,
    )
    packing: bool = opt(True, "Pack several examples per row (padding-free, no cross-attention).")
    num_workers: int = opt(1, "Processes that tokenize (num_proc); results are cached (docs/data-formats.md).")

    def validate(self) -> None:
        if self.eval_split and self.eval_path:
            raise ConfigError(
                "data.eval_split: names a split of data.path, but data.eval_path already gives "
                "the eval data; set one of them"
            )
        if self.num_workers < 1:
            raise ConfigError(f"data.num_workers: expected a positive number, got {self.num_workers}")
        self._validate_eval_by()
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"data.eval_fraction: expected 0 <= x < 1, got {self.eval_fraction}")
        if self.max_rows < 0:
            raise ConfigError(f"data.max_rows: expected >= 0, got {self.max_rows}")
        if self.columns:
            from trainer_lib.data.llamafactory import source_format

            try:
                source_format(self.columns, self.format)
            except ValueError as exc:
                raise ConfigError(f"data.columns: {exc}") from None
        self._validate_registry()
        self._validate_sources()
        self._validate_mix()

    def _validate_eval_by(self) -> None:
        """``data.eval_by``: shuffle, hash or COLUMN:RANGES, and only where the eval rows are split off."""
        from trainer_lib.data.holdout import SHUFFLE, parse_eval_by

        try:
            parse_eval_by(self.eval_by)
        except ValueError as exc:
            raise ConfigError(f"data.eval_by: {exc}") from None
        given = [key for key in ("eval_path", "eval_split", "eval_dataset") if getattr(self, key)]
        if self.eval_by != SHUFFLE and given:
            raise ConfigError(
                f"data.eval_by: splits the eval rows off the training rows, but data.{given[0]} gives them; "
                f"set one of them"
            )

    def given(self) -> bool:
        """Whether the training data is named: ``path``, ``dataset`` or ``sources``."""
        return bool(self.path or self.dataset or self.sources)

    def _validate_sources(self) -> None:
        """``data.sources``: mappings with a ``path`` and only :data:`SOURCE_KEYS`, instead of ``path``/``dataset``."""
        if not self.sources:
            return
        instead = [key for key in ("path", "dataset", "subset", "split", "revision", "columns") if getattr(self, key)]
        if instead:
            raise ConfigError(f"data.sources: name the datasets, but data.{instead[0]} is set too; set it per source")
        for i, source in enumerate(self.sources):
            if not isinstance(source, dict) or not isinstance(source.get("path"), str) or not source["path"]:
                raise ConfigError(f"data.sources[{i}]: expected a mapping with a path, got {source!r}")
            unknown = sorted(set(source) - set(SOURCE_KEYS))
            if unknown:
                raise ConfigError(f"data.sources[{i}]: unknown key {unknown[0]!r}; expected {', '.join(SOURCE_KEYS)}")
            if source.get("columns"):
                from trainer_lib.data.llamafactory import source_format

                try:
                    source_format(source["columns"], self.format)
                except ValueError as exc:
                    raise ConfigError(f"data.sources[{i}].columns: {exc}") from None

    def _validate_registry(self) -> None:
        """``data.dataset`` / ``data.eval_dataset``: names that resolve, without the keys they replace."""
        from trainer_lib.data.llamafactory import registry_sources

        pairs = (("dataset", self.dataset, "path"), ("eval_dataset", self.eval_dataset, "eval_path"))
        for key, names, instead in pairs:
            if not names:
                continue
            if getattr(self, instead):
                raise ConfigError(f"data.{key}: names the data, but data.{instead} is set too; set one of them")
            try:
                registry_sources(names, self.dataset_dir)
            except ValueError as exc:
                raise ConfigError(f"data.{key}: {exc}") from None
        own = {"format": self.format != "auto", "columns": bool(self.columns), "subset": bool(self.subset)}
        own.update(split=bool(self.split), eval_split=bool(self.eval_split), revision=bool(self.revision))
        given = [key for key, set_ in own.items() if set_]
        if self.dataset and given:
            raise ConfigError(
                f"data.{given[0]}: with data.dataset, each dataset's entry in dataset_info.json says this; "
                f"leave data.{given[0]} unset"
            )

    def _validate_mix(self) -> None:
        probs = self.interleave_probs
        if not probs:
            return
        if self.mix_strategy == "concat":
            raise ConfigError(
                "data.interleave_probs: read only with data.mix_strategy interleave_under or interleave_over"
            )
        named = self.dataset or self.sources
        if len(probs) != len(named):
            raise ConfigError(
                f"data.interleave_probs: expected one probability per dataset of data.dataset or data.sources "
                f"({len(named)}), got {len(probs)}"
            )
        if any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-6:
            raise ConfigError(f"data.interleave_probs: expected probabilities >= 0 that sum to 1, got {probs}")


@dataclass
class EngineConfig:
    zero_stage: int = opt(0, "DeepSpeed ZeRO stage.", (0, 1, 2, 3))
    offload_optimizer: bool = opt(False, "Keep optimizer state on CPU (ZeRO-Offload, needs stage >= 1).")
    offload_params: bool = opt(False, "Keep parameters on CPU (ZeRO-3 only).")
    precision: str = opt("fp32", "Training precision.", ("fp32", "bf16"))
    gradient_checkpointing: bool = opt(False, "Recompute activations in backward to save memory.")
    tiled_mlp: bool = opt(
        False,
        "Run each MLP over tiles of hidden_size positions, recomputed in backward (DeepSpeed's TiledMLP): "
        "long sequences without the MLP's whole activations.",
    )
    offload_activations: bool = opt(
        False, "Keep the activations saved for backward in host memory until backward (torch's save_on_cpu)."
    )
    gradient_accumulation_steps: int = opt(1, "Micro-batches per optimizer step.")
    max_grad_norm: float = opt(1.0, "Gradient clipping norm (0 disables).")
    deepspeed_config: str = opt("", "DeepSpeed JSON file (path or URL) laid over posttrain's (docs/configuration.md).")


@dataclass
class LoraConfig:
    r: int = opt(0, "LoRA rank; 0 means full fine-tuning.")
    alpha: int = opt(16, "LoRA scaling alpha.")
    dropout: float = opt(0.0, "LoRA dropout.")
    target_modules: list[str] = opt(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "Modules given adapters; all-linear: every linear layer but the head."
    )
    merge: bool = opt(True, "Merge the adapters into the saved model; false: save the PEFT adapter alone.")


@dataclass
class StorageConfig:
    endpoint_url: str | None = opt(None, "S3-compatible endpoint (MinIO); default $AWS_ENDPOINT_URL.")
    region: str | None = opt(None, "S3 region; default $AWS_DEFAULT_REGION or us-east-1.")
    cache_dir: str | None = opt(None, "Local cache for downloads from URLs; default ~/.cache/posttrain.")


@dataclass
class HubConfig:
    push: bool = opt(False, "Upload the final model to a hub repo (needs HF_TOKEN; HF_ENDPOINT: another hub).")
    model_id: str = opt("", "The hub repo to upload to: user/name or org/name (a bare name: the token's user).")
    private: bool = opt(False, "Create the repo private (an existing repo keeps its visibility).")

    def validate(self) -> None:
        """With ``push``: a repo id. The token and offline mode belong to the machine that trains, so
        they are checked when the stage starts (:func:`trainer_lib.storage.hub.check_ready`), not
        where a pipeline is submitted from."""
        if not self.push:
            return
        from trainer_lib.storage.hub import REPO_ID

        if not self.model_id:
            raise ConfigError("hub.push: needs hub.model_id, the repo to upload to (user/name or org/name)")
        if not REPO_ID.fullmatch(self.model_id) or ".." in self.model_id:
            raise ConfigError(f"hub.model_id: expected user/name or org/name, got {self.model_id!r}")


@dataclass
class ParallelConfig:
    tensor: int = opt(1, "Tensor-parallel size T: each layer's weights split over T ranks (DeepSpeed AutoTP).")
    pipeline: int = opt(
        1, "Pipeline-parallel size P (SFT, DPO): the decoder layers cut into P stages (DeepSpeed's pipeline engine)."
    )
    sequence: int = opt(
        1,
        "Sequence-parallel size S (SFT, DPO): each packed row split over S ranks, attention exchanging heads for "
        "sequence chunks all-to-all (DeepSpeed's Ulysses, ALST).",
    )

    @property
    def replica_ranks(self) -> int:
        """The ranks of one model replica: they read the same rows (T x P x S)."""
        return self.tensor * self.pipeline * self.sequence

    def validate(self) -> None:
        """The checks that need no world size or model: sizes, and what cannot be combined with what
        (the rest: :func:`trainer_lib.engine.parallel.check_layout`)."""
        check_positive(self, "tensor", "pipeline", "sequence")
        if self.sequence > 1 and self.tensor * self.pipeline > 1:
            raise ConfigError(
                f"parallel.sequence={self.sequence} with parallel.tensor={self.tensor} parallel.pipeline="
                f"{self.pipeline}: DeepSpeed's Ulysses runs with data parallelism and ZeRO only; "
                f"use parallel.sequence with ZeRO-3 for a model that does not fit one rank"
            )

    def check_with(self, engine: EngineConfig, lora: LoraConfig) -> None:
        """What DeepSpeed cannot combine with these sizes: its pipeline engine shards optimizer state
        (ZeRO-1) at most, since ZeRO-2/3 would reduce or gather gradients and weights per micro-batch;
        AutoTP shards plain linear layers, and a LoRA-wrapped one breaks its backward (pinned 0.19.8)."""
        if self.tensor > 1 and lora.r > 0:
            raise ConfigError(
                f"parallel.tensor={self.tensor} with lora.r={lora.r}: DeepSpeed's AutoTP does not train LoRA "
                f"adapters; train LoRA with data parallelism and ZeRO instead"
            )
        if self.pipeline > 1 and engine.zero_stage >= 2:
            raise ConfigError(
                f"parallel.pipeline={self.pipeline} with engine.zero_stage={engine.zero_stage}: DeepSpeed's "
                f"pipeline engine supports ZeRO stages 0 and 1 only"
            )
        if self.pipeline > 1 and engine.offload_params:
            raise ConfigError("parallel.pipeline with engine.offload_params: parameter offload needs ZeRO-3")


@dataclass
class PreemptionConfig:
    grace_s: float = opt(
        25.0,
        "On SIGTERM: finish the step, save a checkpoint and exit with status 75 (retryable) within this many "
        "seconds, else exit then without one. Keep it below the pod's terminationGracePeriodSeconds (Kubernetes "
        "default 30) and raise both for large models, whose checkpoints take longer to write; 0: SIGTERM kills.",
    )


@dataclass
class TrainingConfig:
    """Keys every training stage shares; other tools drive the stages through these names."""

    model: ModelConfig = opt(ModelConfig, "Model to start from.")
    data: DataConfig = opt(DataConfig, "Training data.")
    engine: EngineConfig = opt(EngineConfig, "DeepSpeed engine settings.")
    lora: LoraConfig = opt(LoraConfig, "LoRA adapters.")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")
    hub: HubConfig = opt(HubConfig, "Publishing the final model to a Hugging Face hub repo.")
    preemption: PreemptionConfig = opt(PreemptionConfig, "What a stage does on SIGTERM (eviction, preemption).")
    parallel: ParallelConfig = opt(ParallelConfig, "Tensor and pipeline parallelism; data parallel = world / (T x P).")
    output_dir: str | None = opt(None, "Where logs and the final HF model go (local or URL).")
    checkpoint_dir: str | None = opt(None, "Where checkpoints go (local or URL); default <output_dir>/checkpoints.")
    max_steps: int = opt(100, "Optimizer steps to train for.")
    num_epochs: float = opt(0.0, "If > 0, train for this many epochs instead of max_steps.")
    seed: int = opt(0, "Random seed (data order, init, sampling).")
    save_steps: int = opt(50, "Save a resumable checkpoint every N steps and at the end (0: never).")
    save_total_limit: int = opt(2, "Keep at most this many checkpoints (0: keep all).")
    eval_steps: int = opt(50, "Evaluate every N steps (0: only at the end).")
    logging_steps: int = opt(5, "Log metrics every N steps.")
    lr: float = opt(1e-4, "Peak learning rate.")
    lr_scheduler: str = opt("cosine", f"Schedule after warmup, a transformers name: {', '.join(SCHEDULERS)}.")
    lr_scheduler_kwargs: dict = opt({}, "Extra schedule arguments, e.g. {min_lr_rate: 0.1} for cosine_with_min_lr.")
    warmup_steps: int = opt(0, "Linear warmup steps.")
    weight_decay: float = opt(0.0, "AdamW weight decay.")
    adam_beta1: float = opt(0.9, "AdamW beta1 (Hugging Face's default too).")
    adam_beta2: float = opt(0.95, "AdamW beta2; Hugging Face's default (TRL's, LLaMA-Factory's) is 0.999.")
    adam_epsilon: float = opt(1e-8, "AdamW epsilon (Hugging Face's default too).")
    batch_size: int | Literal["auto"] = opt(8, "Micro-batch rows per process; auto: the largest that fits in memory.")
    global_batch_size: int = opt(0, "batch_size=auto: rows per optimizer step, all ranks; 0: what batch_size=8 gives.")
    eval_batch_size: int = opt(16, "Per-process batch size for evaluation.")
    resume: bool = opt(True, "Resume from the latest complete checkpoint in output_dir if one exists.")
    report_to: list[str] = opt(["tensorboard"], "Trackers besides metrics.jsonl: tensorboard, mlflow, wandb, none.")
    loss_plot: bool = opt(False, "At the end, draw training_loss.png (and training_eval_loss.png...) into output_dir.")

    #: the kinds of model parallelism (``parallel.*`` above 1) a stage's loop supports
    MODEL_PARALLEL: ClassVar[tuple[str, ...]] = ("tensor",)

    def validate(self) -> None:
        _require(self.output_dir, "output_dir", "a local path or URL (s3://, gs://...)")
        _require(self.model.path, "model.path", "an HF id, local dir or URL (s3://, gs://, ...)")
        if not self.data.given():
            _require(self.data.path, "data.path", "a dataset path (or data.dataset: names in dataset_info.json)")
        check_positive(
            self,
            "max_steps",
            "eval_batch_size",
            "logging_steps",
            "engine.gradient_accumulation_steps",
            "data.max_length",
        )
        if self.batch_size != "auto":
            check_positive(self, "batch_size")
            if self.global_batch_size:
                raise ConfigError(
                    "global_batch_size: read only with batch_size=auto (otherwise the global batch "
                    "is batch_size x engine.gradient_accumulation_steps x world size)"
                )
        check_non_negative(
            self,
            "save_steps",
            "eval_steps",
            "warmup_steps",
            "lora.r",
            "weight_decay",
            "save_total_limit",
            "num_epochs",
            "engine.max_grad_norm",
            "global_batch_size",
            "preemption.grace_s",
        )
        if not self.lr > 0:
            raise ConfigError(f"lr: expected a positive number, got {self.lr}")
        check_scheduler(self.lr_scheduler)
        check_report_to(self.report_to)
        for key in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"{key}: expected 0 <= x < 1, got {getattr(self, key)}")
        if not self.adam_epsilon > 0:
            raise ConfigError(f"adam_epsilon: expected a positive number, got {self.adam_epsilon}")
        self.data.validate()
        self.hub.validate()
        self.parallel.validate()
        self.parallel.check_with(self.engine, self.lora)
        for key in ("tensor", "pipeline", "sequence"):
            if getattr(self.parallel, key) > 1 and key not in self.MODEL_PARALLEL:
                takes = " and ".join(f"parallel.{k}" for k in self.MODEL_PARALLEL)
                runs = f"takes {takes} besides data parallelism" if takes else "runs data parallelism only"
                raise ConfigError(
                    f"parallel.{key}={getattr(self.parallel, key)}: this stage {runs} (docs/parallelism.md)"
                )
        if self.parallel.sequence > 1 and not self.data.packing:
            raise ConfigError(
                f"parallel.sequence={self.parallel.sequence} with data.packing=false: the ranks split one packed "
                f"row; set data.packing=true"
            )
        chat_templates.check(self.model.chat_template)
        # (a DeepSpeed file may set the stage: then DeepSpeed checks the offload against it)
        if self.engine.offload_optimizer and self.engine.zero_stage == 0 and not self.engine.deepspeed_config:
            raise ConfigError("engine.offload_optimizer: needs engine.zero_stage >= 1")
        if self.engine.offload_params and self.engine.zero_stage != 3 and not self.engine.deepspeed_config:
            raise ConfigError("engine.offload_params: needs engine.zero_stage=3")
        if self.lora.r > 0 and not self.lora.target_modules:
            raise ConfigError("lora.target_modules: expected at least one module name when lora.r > 0")
        if "all-linear" in self.lora.target_modules and len(self.lora.target_modules) > 1:
            raise ConfigError("lora.target_modules: all-linear already names every linear layer; give it alone")

    def optimizer_args(self) -> dict:
        """The keyword arguments of ``strategy.prepare`` that set the optimizer and its schedule."""
        return {
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "betas": (self.adam_beta1, self.adam_beta2),
            "eps": self.adam_epsilon,
            "warmup_steps": self.warmup_steps,
            "lr_scheduler": self.lr_scheduler,
            "lr_scheduler_kwargs": dict(self.lr_scheduler_kwargs),
        }


def check_report_to(report_to: list[str]) -> None:
    """A ConfigError for an unknown tracker, or ``none`` with others."""
    unknown = [name for name in report_to if name not in REPORTERS]
    if unknown:
        raise ConfigError(f"report_to: expected some of {', '.join(REPORTERS)}, got {unknown[0]!r}")
    if "none" in report_to and len(report_to) > 1:
        raise ConfigError(f"report_to: none means no tracker, but {report_to} names others too")


def check_scheduler(name: str) -> None:
    """A ConfigError unless ``name`` is a schedule the training loops can step.

    Names outside :data:`SCHEDULERS` (a newer transformers may add some) are looked up in
    transformers' ``SchedulerType``, which costs a torch import, so only then."""
    if name in METRIC_SCHEDULERS:
        raise ConfigError(
            f"lr_scheduler: {name} steps on an evaluation metric, which the training loops "
            f"do not feed it; expected one of {', '.join(SCHEDULERS)}"
        )
    if name in SCHEDULERS:
        return
    from transformers.trainer_utils import SchedulerType

    known = [s.value for s in SchedulerType if s.value not in METRIC_SCHEDULERS]
    if name not in known:
        raise ConfigError(f"lr_scheduler: expected one of {', '.join(known)}, got {name!r}")


def lookup(cfg: Any, dotted: str) -> Any:
    """``lookup(cfg, "engine.zero_stage")``: the value of a dotted key (``env.class``: the field ``class_``)."""
    for part in dotted.split("."):
        cfg = getattr(cfg, f"{part}_" if keyword.iskeyword(part) else part)
    return cfg


def _require(value: Any, key: str, what: str) -> None:
    if value in (None, ""):
        raise ConfigError(f"{key}: required, expected {what}")


def check_positive(cfg: Any, *keys: str) -> None:
    """A ConfigError naming the first of ``keys`` (dotted) whose value is not > 0."""
    for key in keys:
        if not lookup(cfg, key) > 0:
            raise ConfigError(f"{key}: expected a positive number, got {lookup(cfg, key)}")


def check_non_negative(cfg: Any, *keys: str) -> None:
    """A ConfigError naming the first of ``keys`` (dotted) whose value is < 0."""
    for key in keys:
        if lookup(cfg, key) < 0:
            raise ConfigError(f"{key}: expected >= 0, got {lookup(cfg, key)}")
