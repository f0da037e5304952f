"""Config of the online RL stages, and the engine settings it implies.

Batch arithmetic (all counts across ranks, like ``prompts_per_step``)::

    sequences per step     = prompts_per_step * rollout.n
    mini-batch             = mini_batch_size sequences (0: the whole step) -> one optimizer step
    micro-batch            = batch_size sequences per rank and forward pass
    accumulation           = mini_batch_size / (batch_size * world_size), set on the engine
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainer_lib.config import DataConfig, EngineConfig, TrainingConfig, opt
from trainer_lib.config.judge import LLMJudgeConfig
from trainer_lib.errors import ConfigError, UserError

#: The names of trainer_lib.losses.process_reward.STEP_AGGREGATIONS (not imported: config stays free of torch).
PRM_AGGREGATIONS = ("min", "last", "mean", "steps")


@dataclass
class RolloutConfig:
    n: int = opt(4, "Completions sampled per prompt (the group size of GRPO/RLOO).")
    max_new_tokens: int = opt(64, "Most tokens generated per completion.")
    temperature: float = opt(1.0, "Sampling temperature (0: greedy). Log-probs use the same temperature.")
    top_p: float = opt(1.0, "Nucleus sampling threshold (1: off).")
    top_k: int = opt(0, "Sample among the k most likely tokens (0: off).")
    stop: list[str] = opt([], "Stop strings; the completion ends before the first one (comma-separated on the CLI).")
    batch_size: int = opt(64, "Sequences per generate call (per rank).")
    tis_cap: float = opt(
        0.0,
        "GRPO: truncated importance sampling (Yao et al. 2025) of the sampler's log-probs against the trained "
        "model's: each token's loss times min(pi_train / pi_rollout, tis_cap) (0: off; 2 is a common cap).",
    )


@dataclass
class RewardSourcesConfig:
    functions: list[str] = opt([], "Reward functions: built-in names or module:function (docs/configuration.md).")
    weights: list[float] = opt(
        [],
        "Weights of the environment's reward (with env.class), then the functions, then reward model, then "
        "classifier, then CLIP reward, then LLM judge, then PRM (empty: all 1.0).",
    )
    model_path: str | None = opt(None, "Reward model (from `posttrain reward`), normalized with its stored mean/std.")
    classifier_path: str | None = opt(None, "Sequence classifier (HF id, dir or URL) scoring completions as a reward.")
    classifier_label: str = opt("", "Classifier label (name or index) scored as reward; required if it has several.")
    classifier_score: str = opt("probability", "The label's probability, or its raw logit.", ("probability", "logit"))
    clip_path: str | None = opt(
        None,
        "CLIP-like dual encoder (HF id, dir or URL): rewards (cos + 1) / 2 of the completion and its prompt's "
        "images in its embedding space; prompt rows need an images column (docs/multimodal.md).",
    )
    clip: float = opt(0.0, "Clip the combined reward to [-clip, clip] after normalization (0: off).")
    normalize: str = opt("none", "Normalize the reward by this step's or running stats.", ("none", "batch", "running"))
    code_timeout: float = opt(3.0, "code_execution: wall-clock seconds per program in the sandbox.")
    sandbox_workers: int = opt(4, "code_execution: sandbox processes running tests in parallel.")
    length_free_tokens: int = opt(0, "length_penalty: tokens without penalty; it reaches -1 at rollout.max_new_tokens.")
    judge: LLMJudgeConfig = opt(
        LLMJudgeConfig,
        "An LLM as judge (an OpenAI-compatible endpoint or a local causal LM) scoring completions with a rubric: "
        "the source llm_judge, its score mapped to [0, 1] (docs/training.md).",
    )
    prm_path: str | None = opt(
        None, "A process reward model (posttrain reward objective=process) scoring each completion's steps: prm."
    )
    prm_aggregation: str = opt(
        "min",
        "prm_path: one reward from the step scores: the weakest step, the last, or their mean; steps (PPO): "
        "each step's score a reward on the token that ends the step.",
        PRM_AGGREGATIONS,
    )


#: ``env.class`` values built in (besides ``module:Class``), ``env.tools`` names and ``env.reward`` values; the
#: classes and tools themselves are in trainer_lib.agents (not imported: config stays free of what it builds).
BUILTIN_ENVIRONMENTS = ("tools",)
BUILTIN_TOOLS = ("calculator", "python", "search")
EPISODE_REWARDS = ("final", "sum", "turns")


@dataclass
class EnvConfig:
    class_: str | None = opt(
        None,
        "Multi-turn episodes (GRPO; evaluate's env.path): the environment the policy acts in, tools (a question "
        "answered with env.tools, its final answer scored by env.checker) or package.module:Class built with "
        "env.settings (docs/training.md#agents-and-tools). Unset: one completion per prompt.",
    )
    settings: dict = opt(
        {},
        "Keyword arguments of the environment class; for tools: system_prompt, timeout, max_output_chars, "
        "max_concurrency, max_calls_per_step.",
    )
    tools: list[str] = opt([], f"env.class=tools: the built-in tools offered ({', '.join(BUILTIN_TOOLS)}).")
    corpus: str | None = opt(None, "The search tool's documents: a .jsonl file of text fields, or one per line.")
    checker: str = opt(
        "accuracy_reward",
        "env.class=tools: the reward function (built-in or module:function) that scores the final answer.",
    )
    max_turns: int = opt(4, "Most assistant turns per episode.")
    max_total_tokens: int = opt(
        1024, "Most tokens per episode: the prompt, the model's turns and the environment's messages."
    )
    reward: str = opt(
        "final",
        "The episode's reward from its step rewards: the last step's (final), their sum discounted by "
        "env.gamma per turn (sum), or (PPO) each step's reward on the last token of its turn (turns).",
        EPISODE_REWARDS,
    )
    gamma: float = opt(1.0, "env.reward=sum: the discount per turn, G_0 = sum_t gamma^t r_t.")

    def check(self, rollout: RolloutConfig | None = None) -> None:
        """The env keys among themselves and with ``rollout`` (an RL stage's); nothing is loaded here."""
        if self.class_ is None:
            return
        if self.class_ not in BUILTIN_ENVIRONMENTS and ":" not in self.class_:
            raise ConfigError(
                f"env.class: expected {' or '.join(BUILTIN_ENVIRONMENTS)} or package.module:Class, got {self.class_!r}"
            )
        unknown = [name for name in self.tools if name not in BUILTIN_TOOLS]
        if unknown:
            raise ConfigError(f"env.tools: expected some of {', '.join(BUILTIN_TOOLS)}, got {unknown[0]!r}")
        if self.class_ == "tools" and not self.tools:
            raise ConfigError(f"env.tools: env.class=tools needs at least one tool ({', '.join(BUILTIN_TOOLS)})")
        if self.class_ != "tools" and self.tools:
            raise ConfigError("env.tools: the built-in tools are for env.class=tools (a class builds its own)")
        if "search" in self.tools and not self.corpus:
            raise ConfigError("env.corpus: the search tool needs its documents (a .jsonl or text file)")
        if self.max_turns < 1 or self.max_total_tokens < 2 or not 0 <= self.gamma <= 1:
            raise ConfigError(
                "env: expected max_turns >= 1, max_total_tokens >= 2 and 0 <= gamma <= 1, got "
                f"{self.max_turns}, {self.max_total_tokens}, {self.gamma}"
            )
        if rollout is not None and rollout.stop:
            raise ConfigError("rollout.stop: not supported with env.class (a turn ends at the end-of-turn token)")


BUFFER_MODES = ("shuffle", "uniform", "priority")


@dataclass
class PromptBufferConfig:
    mode: str = opt(
        "shuffle",
        "Which prompts a step takes: a fixed seeded shuffle, epoch by epoch (shuffle); a live pool drawn at "
        "random each step (uniform), or weighted by each prompt's last learning signal (priority). uniform and "
        "priority take prompts from data.feedback_path and support dynamic_sampling (docs/training.md).",
        BUFFER_MODES,
    )
    temperature: float = opt(1.0, "priority: draw weight = priority ** (1 / temperature); higher is flatter.")
    uniform_mix: float = opt(0.1, "priority: share of the draw probability spread evenly, so no prompt starves.")
    dynamic_sampling: bool = opt(
        False, "DAPO's dynamic sampling: drop groups whose rewards are all equal and draw prompts to replace them."
    )
    max_resample_rounds: int = opt(3, "dynamic_sampling: most extra rounds of sampling per step to fill the batch.")


@dataclass
class RLDataConfig(DataConfig):
    feedback_path: str | None = opt(
        None,
        "Directory or s3:// prefix watched while training: new .jsonl prompt files there join the prompt pool "
        "between steps (needs buffer.mode uniform or priority; docs/data-formats.md).",
    )


@dataclass
class RLConfig(TrainingConfig):
    """The keys PPO and GRPO share; each stage's config adds its algorithm's keys."""

    data: RLDataConfig = opt(RLDataConfig, "Training prompts, and a directory of prompts added while training.")
    buffer: PromptBufferConfig = opt(PromptBufferConfig, "How each step's prompts are chosen from the pool.")
    rollout: RolloutConfig = opt(RolloutConfig, "Sampling of completions.")
    reward: RewardSourcesConfig = opt(RewardSourcesConfig, "Reward sources and post-processing.")
    env: EnvConfig = opt(EnvConfig, "Multi-turn episodes with tools or an environment (GRPO).")
    prompts_per_step: int = opt(8, "Prompts per step, all ranks together (each gets rollout.n completions).")
    ppo_epochs: int = opt(1, "Passes over each step's completions (TRL's num_iterations).")
    mini_batch_size: int = opt(0, "Completions per optimizer step, all ranks together (0: all of a step).")
    multi_adapter: bool = opt(False, "All RL roles as LoRA adapters on one frozen base; needs lora.r > 0.")

    #: rollouts generate with the policy in one process per rank: no tensor or pipeline groups yet
    MODEL_PARALLEL = ()
    #: whether the stage takes rewards on tokens (reward.prm_aggregation=steps): PPO's GAE does
    TOKEN_REWARDS = False

    def validate(self) -> None:
        super().validate()
        r = self.rollout
        if r.n < 1 or r.max_new_tokens < 1 or r.batch_size < 1:
            raise ConfigError("rollout.n, rollout.max_new_tokens, rollout.batch_size: expected positive integers")
        if r.temperature < 0 or not 0 < r.top_p <= 1 or r.top_k < 0:
            raise ConfigError("rollout: expected temperature >= 0, 0 < top_p <= 1 and top_k >= 0")
        if self.reward.clip < 0:
            raise ConfigError(f"reward.clip: expected >= 0, got {self.reward.clip}")
        reward = self.reward
        sources = (reward.model_path, reward.classifier_path, reward.clip_path, reward.judge.enabled, reward.prm_path)
        if not (reward.functions or any(sources) or self.env.class_):
            raise ConfigError(
                "reward.functions: required (or reward.model_path, reward.classifier_path, reward.clip_path, "
                "reward.judge.url / reward.judge.path, reward.prm_path or env.class), e.g. "
                "reward.functions=code_execution or my_rewards:reward"
            )
        self.env.check(self.rollout)
        reward.judge.check("reward.judge")
        if self.env.class_ and self.env.reward == "turns" and not self.TOKEN_REWARDS:
            raise ConfigError(
                "env.reward=turns: rewards on each turn's last token are PPO's (its GAE credits them where they "
                "stand); this stage needs one reward per episode: final or sum"
            )
        if reward.prm_path and reward.prm_aggregation == "steps" and not self.TOKEN_REWARDS:
            raise ConfigError(
                "reward.prm_aggregation=steps: rewards on each step's last token are PPO's (its GAE credits them "
                "where they stand); this stage needs one score per completion: min, last or mean"
            )
        if self.prompts_per_step < 1 or self.ppo_epochs < 1 or self.mini_batch_size < 0:
            raise ConfigError("prompts_per_step, ppo_epochs: expected >= 1; mini_batch_size: expected >= 0")
        if self.multi_adapter and self.lora.r <= 0:
            raise ConfigError(
                "multi_adapter: needs lora.r > 0 (the roles are LoRA adapters of one frozen base), "
                f"got lora.r={self.lora.r}"
            )
        if self.multi_adapter and self.engine.zero_stage == 3:
            raise ConfigError(
                "multi_adapter: not supported with engine.zero_stage=3 (use ZeRO 0-2: the frozen base "
                "is shared, only the small adapters are trained and partitioned)"
            )
        self.validate_buffer()
        if self.engine.gradient_accumulation_steps != 1:
            raise ConfigError(
                "engine.gradient_accumulation_steps: RL stages derive it from "
                "mini_batch_size / (batch_size * world size); set mini_batch_size instead"
            )
        if self.sequences_per_step % self.mini_batch:
            raise ConfigError(
                f"mini_batch_size: {self.mini_batch} does not divide the {self.sequences_per_step} "
                f"sequences of a step (prompts_per_step * rollout.n)"
            )

    def validate_buffer(self) -> None:
        b = self.buffer
        if b.temperature <= 0 or not 0 <= b.uniform_mix <= 1 or b.max_resample_rounds < 0:
            raise ConfigError(
                "buffer: expected temperature > 0, 0 <= uniform_mix <= 1 and max_resample_rounds >= 0, got "
                f"{b.temperature}, {b.uniform_mix}, {b.max_resample_rounds}"
            )
        live = [
            key
            for key, on in (
                ("data.feedback_path", self.data.feedback_path),
                ("buffer.dynamic_sampling", b.dynamic_sampling),
            )
            if on
        ]
        if live and b.mode == "shuffle":
            raise ConfigError(
                f"{live[0]}: needs a live prompt pool, buffer.mode=uniform or buffer.mode=priority "
                "(the default fixed shuffle cannot take new prompts or replace dropped ones)"
            )
        if b.dynamic_sampling and self.rollout.n < 2:
            raise ConfigError(
                "buffer.dynamic_sampling: needs rollout.n >= 2 (it drops groups whose rewards are all equal)"
            )

    @property
    def sequences_per_step(self) -> int:
        return self.prompts_per_step * self.rollout.n

    @property
    def mini_batch(self) -> int:
        """Sequences per optimizer step, all ranks together."""
        return self.mini_batch_size or self.sequences_per_step

    def updates_per_step(self) -> int:
        """Optimizer steps per RL step."""
        return self.update_epochs() * self.sequences_per_step // self.mini_batch

    def update_epochs(self) -> int:
        """``ppo_epochs``, as a stage resolves it (also before validation, e.g. for ``warmup_ratio``)."""
        return self.ppo_epochs

    def engine_for(self, world_size: int) -> EngineConfig:
        """The engine settings for ``world_size`` ranks: accumulation = mini-batch / (batch_size * world)."""
        if self.prompts_per_step % world_size or self.mini_batch % (world_size * self.batch_size):
            raise UserError(
                f"prompts_per_step ({self.prompts_per_step}) must be a multiple of the world size "
                f"({world_size}), and the mini-batch ({self.mini_batch} sequences) of batch_size * "
                f"world size ({self.batch_size * world_size})"
            )
        # under parallel.sequence each rank of a group trains on every member's micro-batches in turn
        # (rl/update_passes.py): S micro-steps per micro-batch
        accumulation = self.mini_batch // (world_size * self.batch_size) * self.parallel.sequence
        return dataclasses.replace(self.engine, gradient_accumulation_steps=accumulation)
