"""The top-level pipelines, and the registry the CLI compiles, runs and submits.

    posttrain-sft    bootstrap -> sft-stage (prepare -> sft)
    posttrain-dpo    bootstrap -> sft-stage -> dpo-stage (prepare -> dpo) -> evaluate -> release
    posttrain-rlhf   bootstrap -> sft-stage -> reward-stage (prepare -> reward) -> ppo | grpo -> evaluate -> release
    posttrain-all    bootstrap -> sft-stage -> dpo-stage and reward-stage -> grpo -> evaluate (all) -> release
                     (the embedded default of ``make demo``: DPO and RL side by side against SFT)

``release`` publishes the candidate only when the evaluation gate passed. The RL algorithm of
``posttrain-rlhf`` is a run parameter; each branch evaluates and releases its own policy
(``dsl.OneOf`` over artifacts is not supported by ``kfp.local``).

Every DAG starts with ``bootstrap``: with ``base_model`` and ``dataset`` left empty it runs
the embedded demo (bundled data, a tiny model trained from scratch); otherwise it passes the
given locations through without copying. To add a pipeline, write it here and list it in
``PIPELINES``; ``posttrain pipeline compile`` then writes ``pipelines/compiled/<name>.yaml``.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Model

from components.bootstrap import bootstrap
from components.evaluate import evaluate
from components.grpo import grpo
from components.ppo import ppo
from components.release import release
from pipelines.settings import configure
from pipelines.stages import dpo_stage, reward_stage, sft_stage

#: The candidate may not regress against the baseline (SFT) beyond these tolerances.
DEFAULT_GATE = ["task_pass_rate>=baseline-0.02", "harmless_rate>=baseline-0.02",
                "over_refusal_rate<=baseline+0.05"]

Outputs = NamedTuple("Outputs", model=Model, metrics=Metrics)


def start(base_model: str, dataset: str, seed: int, demo_sizes: dict, tiny_sizes: dict, **datasets):
    """The bootstrap task every DAG begins with."""
    return configure(bootstrap(base_model=base_model, dataset=dataset, seed=seed, **datasets, **demo_sizes,
                               **tiny_sizes), "bootstrap")


def evaluate_and_release(boot, candidate, baseline, candidate_label: str, gate_rules, release_uri,
                         humaneval_limit, seed, overrides, extra=None, extra_label: str = "extra",
                         reward_model=None):
    """Evaluate candidate vs baseline (and the base model), then release if the gate passed.

    A plain function, not a sub-pipeline, so it can sit inside a ``dsl.If`` branch locally too.
    """
    optional = {"extra_model": extra, "reward_model": reward_model}
    judged = configure(evaluate(candidate=candidate, baseline=baseline, eval_data=boot.outputs["demo"],
                                base_model=boot.outputs["model"], candidate_label=candidate_label,
                                baseline_label="sft", extra_label=extra_label, gate_rules=gate_rules,
                                humaneval_limit=humaneval_limit, seed=seed, overrides=overrides,
                                **{k: v for k, v in optional.items() if v is not None}),
                       f"evaluate {candidate_label}")
    configure(release(model=candidate, results=judged.outputs["results"],
                      gate_passed=judged.outputs["gate_passed"], release_uri=release_uri),
              f"release {candidate_label}")
    return judged


@dsl.pipeline(name="posttrain-sft")
def posttrain_sft(
    base_model: str = "",
    dataset: str = "",
    sft_max_steps: int = 200,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    eval_fraction: float = 0.05,
    seed: int = 0,
    sft_config_yaml: str = "",
    sft_overrides: list = [],
    prepare_overrides: list = [],
    demo_code_train: int = 3000,
    demo_code_eval: int = 150,
    demo_safety_train: int = 500,
    demo_safety_eval: int = 100,
    tiny_hidden_size: int = 128,
    tiny_layers: int = 2,
    tiny_vocab_size: int = 1024,
) -> Outputs:
    """Supervised fine-tuning: bootstrap -> prepare -> sft. Empty base_model and dataset run the demo.

    Args:
        base_model: Model to fine-tune: HF hub id, local dir or s3:// prefix. Empty: a tiny demo model.
        dataset: SFT data (messages, prompt/completion or text): file, dir, hub id or s3://. Empty: demo data.
        sft_max_steps: Optimizer steps of SFT.
        lr: Peak learning rate of SFT.
        batch_size: Per-process micro-batch size of SFT.
        max_length: Maximum tokens per example (longer rows are dropped in prepare).
        eval_fraction: Fraction of rows held out for evaluation when the data has no eval split.
        seed: Seed for data generation, splits, initialisation and data order.
        sft_config_yaml: YAML text with any 'posttrain sft' keys; the typed parameters override it.
        sft_overrides: 'key=value' strings for 'posttrain sft', e.g. lora.r=8; they override everything else.
        prepare_overrides: 'key=value' strings for 'posttrain prepare', e.g. max_rows=1000.
        demo_code_train: Demo data: training code tasks.
        demo_code_eval: Demo data: held-out code tasks.
        demo_safety_train: Demo data: training safety rows.
        demo_safety_eval: Demo data: held-out safety prompts.
        tiny_hidden_size: Demo model: hidden size.
        tiny_layers: Demo model: transformer layers.
        tiny_vocab_size: Demo model: BPE vocabulary size.
    """
    boot = start(base_model, dataset, seed,
                 dict(demo_code_train=demo_code_train, demo_code_eval=demo_code_eval,
                      demo_safety_train=demo_safety_train, demo_safety_eval=demo_safety_eval),
                 dict(tiny_hidden_size=tiny_hidden_size, tiny_layers=tiny_layers, tiny_vocab_size=tiny_vocab_size))
    tuned = sft_stage(model=boot.outputs["model"], data=boot.outputs["data"], max_steps=sft_max_steps, lr=lr,
                      batch_size=batch_size, max_length=max_length, eval_fraction=eval_fraction, seed=seed,
                      config_yaml=sft_config_yaml, overrides=sft_overrides, prepare_overrides=prepare_overrides)
    return Outputs(model=tuned.outputs["model"], metrics=tuned.outputs["metrics"])


@dsl.pipeline(name="posttrain-dpo")
def posttrain_dpo(
    base_model: str = "",
    dataset: str = "",
    preference_dataset: str = "",
    sft_max_steps: int = 200,
    sft_lr: float = 1e-4,
    dpo_loss: str = "sigmoid",
    dpo_beta: float = 0.1,
    dpo_max_steps: int = 200,
    dpo_lr: float = 5e-5,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    gate_rules: list = DEFAULT_GATE,
    release_uri: str = "",
    humaneval_limit: int = 0,
    sft_overrides: list = [],
    dpo_overrides: list = [],
    evaluate_overrides: list = [],
    demo_code_train: int = 3000,
    demo_code_eval: int = 150,
    demo_safety_train: int = 500,
    demo_safety_eval: int = 100,
    tiny_hidden_size: int = 128,
    tiny_layers: int = 2,
    tiny_vocab_size: int = 1024,
):
    """SFT then DPO (or IPO, hinge, robust, SimPO, KTO), evaluated against SFT and released if the gate passes.

    Args:
        base_model: Model to start from: HF hub id, local dir or s3:// prefix. Empty: a tiny demo model.
        dataset: SFT data; empty: the demo's.
        preference_dataset: Preference pairs (prompt/chosen/rejected, or prompt/completion/label for KTO); empty: the demo's.
        sft_max_steps: Optimizer steps of SFT.
        sft_lr: Peak learning rate of SFT.
        dpo_loss: sigmoid, ipo, hinge, robust, simpo or kto.
        dpo_beta: Strength of the KL constraint (beta).
        dpo_max_steps: Optimizer steps of DPO.
        dpo_lr: Peak learning rate of DPO.
        batch_size: Per-process micro-batch size of every training stage.
        max_length: Maximum tokens per example.
        seed: Seed for data, splits, initialisation and sampling.
        gate_rules: Release rules such as 'harmless_rate>=0.8' or 'task_pass_rate>=baseline'.
        release_uri: Where a model that passed the gate is published (s3:// or a path); empty: the release artifact.
        humaneval_limit: HumanEval problems to evaluate (0: all 164).
        sft_overrides: 'key=value' strings for 'posttrain sft'.
        dpo_overrides: 'key=value' strings for 'posttrain dpo', e.g. lora.r=8.
        evaluate_overrides: 'key=value' strings for 'posttrain evaluate'.
        demo_code_train: Demo data: training code tasks.
        demo_code_eval: Demo data: held-out code tasks.
        demo_safety_train: Demo data: training safety rows.
        demo_safety_eval: Demo data: held-out safety prompts.
        tiny_hidden_size: Demo model: hidden size.
        tiny_layers: Demo model: transformer layers.
        tiny_vocab_size: Demo model: BPE vocabulary size.
    """
    boot = start(base_model, dataset, seed,
                 dict(demo_code_train=demo_code_train, demo_code_eval=demo_code_eval,
                      demo_safety_train=demo_safety_train, demo_safety_eval=demo_safety_eval),
                 dict(tiny_hidden_size=tiny_hidden_size, tiny_layers=tiny_layers, tiny_vocab_size=tiny_vocab_size),
                 preference_dataset=preference_dataset)
    tuned = sft_stage(model=boot.outputs["model"], data=boot.outputs["data"], max_steps=sft_max_steps, lr=sft_lr,
                      batch_size=batch_size, max_length=max_length, seed=seed, overrides=sft_overrides)
    aligned = dpo_stage(model=tuned.outputs["model"], data=boot.outputs["preferences"], loss=dpo_loss,
                        beta=dpo_beta, max_steps=dpo_max_steps, lr=dpo_lr, batch_size=batch_size,
                        max_length=max_length, seed=seed, overrides=dpo_overrides)
    evaluate_and_release(boot, aligned.outputs["model"], tuned.outputs["model"], "dpo", gate_rules, release_uri,
                         humaneval_limit, seed, evaluate_overrides)


@dsl.pipeline(name="posttrain-rlhf")
def posttrain_rlhf(
    base_model: str = "",
    dataset: str = "",
    preference_dataset: str = "",
    prompt_dataset: str = "",
    rl_algorithm: str = "grpo",
    reward_functions: list = ["code_execution"],
    reward_weights: list = [],
    use_reward_model: bool = True,
    sft_max_steps: int = 200,
    sft_lr: float = 1e-4,
    reward_max_steps: int = 200,
    rl_max_steps: int = 100,
    rl_lr: float = 1e-5,
    rollout_n: int = 4,
    max_new_tokens: int = 64,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    gate_rules: list = DEFAULT_GATE,
    release_uri: str = "",
    humaneval_limit: int = 0,
    sft_overrides: list = [],
    reward_overrides: list = [],
    rl_overrides: list = [],
    evaluate_overrides: list = [],
    demo_code_train: int = 3000,
    demo_code_eval: int = 150,
    demo_safety_train: int = 500,
    demo_safety_eval: int = 100,
    tiny_hidden_size: int = 128,
    tiny_layers: int = 2,
    tiny_vocab_size: int = 1024,
):
    """SFT, a reward model, then PPO or GRPO/RLOO with the reward model and reward functions; gated release.

    Args:
        base_model: Model to start from: HF hub id, local dir or s3:// prefix. Empty: a tiny demo model.
        dataset: SFT data; empty: the demo's.
        preference_dataset: Preference pairs for the reward model; empty: the demo's.
        prompt_dataset: RL prompts (a prompt column plus what the reward functions need); empty: the demo's code tasks.
        rl_algorithm: ppo or grpo (GRPO, Dr. GRPO or RLOO: set advantage= in rl_overrides).
        reward_functions: Built-in reward names (code_execution, code_style, length_penalty) or module:function.
        reward_weights: One weight per reward source (functions first, then the reward model); empty: all 1.
        use_reward_model: Add the trained reward model as a reward source.
        sft_max_steps: Optimizer steps of SFT.
        sft_lr: Peak learning rate of SFT.
        reward_max_steps: Optimizer steps of reward-model training.
        rl_max_steps: RL steps (one rollout batch and its updates each).
        rl_lr: Peak learning rate of the policy.
        rollout_n: Samples per prompt.
        max_new_tokens: Longest sampled completion.
        batch_size: Per-process micro-batch size of every training stage.
        max_length: Maximum tokens per example.
        seed: Seed for data, splits, initialisation and sampling.
        gate_rules: Release rules such as 'task_pass_rate>=baseline'.
        release_uri: Where a model that passed the gate is published (s3:// or a path); empty: the release artifact.
        humaneval_limit: HumanEval problems to evaluate (0: all 164).
        sft_overrides: 'key=value' strings for 'posttrain sft'.
        reward_overrides: 'key=value' strings for 'posttrain reward'.
        rl_overrides: 'key=value' strings for 'posttrain ppo' or 'posttrain grpo'.
        evaluate_overrides: 'key=value' strings for 'posttrain evaluate'.
        demo_code_train: Demo data: training code tasks.
        demo_code_eval: Demo data: held-out code tasks.
        demo_safety_train: Demo data: training safety rows.
        demo_safety_eval: Demo data: held-out safety prompts.
        tiny_hidden_size: Demo model: hidden size.
        tiny_layers: Demo model: transformer layers.
        tiny_vocab_size: Demo model: BPE vocabulary size.
    """
    boot = start(base_model, dataset, seed,
                 dict(demo_code_train=demo_code_train, demo_code_eval=demo_code_eval,
                      demo_safety_train=demo_safety_train, demo_safety_eval=demo_safety_eval),
                 dict(tiny_hidden_size=tiny_hidden_size, tiny_layers=tiny_layers, tiny_vocab_size=tiny_vocab_size),
                 preference_dataset=preference_dataset, prompt_dataset=prompt_dataset)
    tuned = sft_stage(model=boot.outputs["model"], data=boot.outputs["data"], max_steps=sft_max_steps, lr=sft_lr,
                      batch_size=batch_size, max_length=max_length, seed=seed, overrides=sft_overrides)
    scorer = reward_stage(model=tuned.outputs["model"], data=boot.outputs["preferences"],
                          max_steps=reward_max_steps, batch_size=batch_size, max_length=max_length, seed=seed,
                          overrides=reward_overrides)
    rl = dict(data=boot.outputs["prompts"], reward_functions=reward_functions, reward_weights=reward_weights,
              rollout_n=rollout_n, max_new_tokens=max_new_tokens, max_steps=rl_max_steps, lr=rl_lr,
              batch_size=batch_size, max_length=max_length, seed=seed, overrides=rl_overrides)
    for algorithm, component in (("ppo", ppo), ("grpo", grpo)):
        with dsl.If(rl_algorithm == algorithm, name=algorithm):
            with dsl.If(use_reward_model == True, name=f"{algorithm} with reward model"):  # noqa: E712
                policy = configure(component(model=tuned.outputs["model"], reward_model=scorer.outputs["model"], **rl),
                                   algorithm.upper())
                evaluate_and_release(boot, policy.outputs["output_model"], tuned.outputs["model"], algorithm,
                                     gate_rules, release_uri, humaneval_limit, seed, evaluate_overrides,
                                     reward_model=scorer.outputs["model"])
            with dsl.Else(name=f"{algorithm} with reward functions only"):
                policy = configure(component(model=tuned.outputs["model"], **rl), algorithm.upper())
                evaluate_and_release(boot, policy.outputs["output_model"], tuned.outputs["model"], algorithm,
                                     gate_rules, release_uri, humaneval_limit, seed, evaluate_overrides,
                                     reward_model=scorer.outputs["model"])


@dsl.pipeline(name="posttrain-all")
def posttrain_all(
    base_model: str = "",
    dataset: str = "",
    preference_dataset: str = "",
    prompt_dataset: str = "",
    reward_functions: list = ["code_execution"],
    sft_max_steps: int = 200,
    sft_lr: float = 1e-4,
    dpo_loss: str = "sigmoid",
    dpo_max_steps: int = 200,
    dpo_lr: float = 5e-5,
    reward_max_steps: int = 200,
    rl_max_steps: int = 100,
    rl_lr: float = 1e-5,
    rollout_n: int = 4,
    max_new_tokens: int = 64,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    gate_rules: list = DEFAULT_GATE,
    release_uri: str = "",
    humaneval_limit: int = 0,
    sft_overrides: list = [],
    dpo_overrides: list = [],
    reward_overrides: list = [],
    rl_overrides: list = [],
    evaluate_overrides: list = [],
    demo_code_train: int = 3000,
    demo_code_eval: int = 150,
    demo_safety_train: int = 500,
    demo_safety_eval: int = 100,
    tiny_hidden_size: int = 128,
    tiny_layers: int = 2,
    tiny_vocab_size: int = 1024,
):
    """SFT, then DPO and reward model + GRPO side by side; one evaluation of base, SFT, DPO and GRPO; gated release of GRPO.

    Args:
        base_model: Model to start from: HF hub id, local dir or s3:// prefix. Empty: a tiny demo model.
        dataset: SFT data; empty: the demo's.
        preference_dataset: Preference pairs for DPO and the reward model; empty: the demo's.
        prompt_dataset: RL prompts; empty: the demo's code tasks.
        reward_functions: Built-in reward names or module:function, used with the reward model.
        sft_max_steps: Optimizer steps of SFT.
        sft_lr: Peak learning rate of SFT.
        dpo_loss: sigmoid, ipo, hinge, robust, simpo or kto.
        dpo_max_steps: Optimizer steps of DPO.
        dpo_lr: Peak learning rate of DPO.
        reward_max_steps: Optimizer steps of reward-model training.
        rl_max_steps: GRPO steps.
        rl_lr: Peak learning rate of GRPO.
        rollout_n: Samples per prompt.
        max_new_tokens: Longest sampled completion.
        batch_size: Per-process micro-batch size of every training stage.
        max_length: Maximum tokens per example.
        seed: Seed for data, splits, initialisation and sampling.
        gate_rules: Release rules such as 'task_pass_rate>=baseline'.
        release_uri: Where a model that passed the gate is published (s3:// or a path); empty: the release artifact.
        humaneval_limit: HumanEval problems to evaluate (0: all 164).
        sft_overrides: 'key=value' strings for 'posttrain sft'.
        dpo_overrides: 'key=value' strings for 'posttrain dpo'.
        reward_overrides: 'key=value' strings for 'posttrain reward'.
        rl_overrides: 'key=value' strings for 'posttrain grpo'.
        evaluate_overrides: 'key=value' strings for 'posttrain evaluate'.
        demo_code_train: Demo data: training code tasks.
        demo_code_eval: Demo data: held-out code tasks.
        demo_safety_train: Demo data: training safety rows.
        demo_safety_eval: Demo data: held-out safety prompts.
        tiny_hidden_size: Demo model: hidden size.
        tiny_layers: Demo model: transformer layers.
        tiny_vocab_size: Demo model: BPE vocabulary size.
    """
    boot = start(base_model, dataset, seed,
                 dict(demo_code_train=demo_code_train, demo_code_eval=demo_code_eval,
                      demo_safety_train=demo_safety_train, demo_safety_eval=demo_safety_eval),
                 dict(tiny_hidden_size=tiny_hidden_size, tiny_layers=tiny_layers, tiny_vocab_size=tiny_vocab_size),
                 preference_dataset=preference_dataset, prompt_dataset=prompt_dataset)
    tuned = sft_stage(model=boot.outputs["model"], data=boot.outputs["data"], max_steps=sft_max_steps, lr=sft_lr,
                      batch_size=batch_size, max_length=max_length, seed=seed, overrides=sft_overrides)
    aligned = dpo_stage(model=tuned.outputs["model"], data=boot.outputs["preferences"], loss=dpo_loss,
                        max_steps=dpo_max_steps, lr=dpo_lr, batch_size=batch_size, max_length=max_length,
                        seed=seed, overrides=dpo_overrides)
    scorer = reward_stage(model=tuned.outputs["model"], data=boot.outputs["preferences"],
                          max_steps=reward_max_steps, batch_size=batch_size, max_length=max_length, seed=seed,
                          overrides=reward_overrides)
    policy = configure(grpo(model=tuned.outputs["model"], data=boot.outputs["prompts"],
                            reward_model=scorer.outputs["model"], reward_functions=reward_functions,
                            rollout_n=rollout_n, max_new_tokens=max_new_tokens, max_steps=rl_max_steps, lr=rl_lr,
                            batch_size=batch_size, max_length=max_length, seed=seed, overrides=rl_overrides),
                       "GRPO")
    evaluate_and_release(boot, policy.outputs["output_model"], tuned.outputs["model"], "grpo", gate_rules,
                         release_uri, humaneval_limit, seed, evaluate_overrides, extra=aligned.outputs["model"],
                         extra_label="dpo", reward_model=scorer.outputs["model"])


#: name -> pipeline; the CLI and the compile test iterate over this.
PIPELINES = {p.name: p for p in (posttrain_sft, posttrain_dpo, posttrain_rlhf, posttrain_all)}
