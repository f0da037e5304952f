"""The top-level pipelines, and the registry the CLI compiles, runs and submits.

    posttrain-sft    bootstrap -> prepare -> SFT
    posttrain-dpo    bootstrap -> prepare -> SFT -> prepare -> DPO -> evaluate -> release
    posttrain-rlhf   bootstrap -> prepare -> SFT -> prepare -> reward model -> PPO | GRPO -> evaluate -> release
    posttrain-all    bootstrap -> prepare -> SFT -> prepare -> DPO -> GRPO (from DPO; prepare -> reward
                     model beside it) -> evaluate (all) -> release
                     (the embedded default of ``make demo``: each stage measured against SFT)

``release`` publishes the candidate only when the evaluation gate passed. The RL algorithm of
``posttrain-rlhf`` is a run parameter; each branch evaluates and releases its own policy
(``dsl.OneOf`` over artifacts is not supported by ``kfp.local``).

Every DAG starts with ``bootstrap``: with ``base_model`` and ``dataset`` left empty it runs
the embedded demo (bundled data, a tiny model trained from scratch); otherwise it passes the
given locations through without copying. The DAGs are composed from small named steps, plain
functions (:func:`prepare_and_train`, :func:`evaluate_and_release`) rather than sub-pipelines, so
they work inside ``dsl.If`` branches under ``kfp.local`` too. To add a pipeline, write it here and list it in
``PIPELINES``; ``posttrain pipeline compile`` then writes ``pipelines/compiled/<name>.yaml``.
"""

import inspect
from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Model

from components.bootstrap import bootstrap
from components.check import check_config
from components.deploy import deploy
from components.evaluate import evaluate
from components.export import export
from components.fingerprint import fingerprint
from components.prepare import prepare
from components.release import release
from components.train import train
from pipelines.settings import configure

#: The candidate may not regress against the baseline (SFT) beyond these tolerances.
DEFAULT_GATE = ["task_pass_rate>=baseline-0.02", "harmless_rate>=baseline-0.02", "over_refusal_rate<=baseline+0.05"]


class Outputs(NamedTuple):
    model: Model
    metrics: Metrics


#: Every parameter of the top-level pipelines, documented once (the KFP UI shows these texts).
PARAMETER_DOCS = {
    "base_model": "Model to start from: HF hub id, local dir or s3:// prefix. Empty: a tiny demo model.",
    "dataset": "SFT data (messages, prompt/completion or text): file, dir, hub id or s3://. Empty: the demo's.",
    "preference_dataset": "Preference pairs (prompt/chosen/rejected, or prompt/completion/label for KTO) for "
    "DPO and the reward model; empty: the demo's.",
    "prompt_dataset": "RL prompts (a prompt column plus what the reward functions need); empty: the demo's code tasks.",
    "rl_algorithm": "ppo or grpo (GRPO, Dr. GRPO or RLOO: set advantage= in rl_overrides).",
    "reward_functions": "Built-in reward names (code_execution, code_style, length_penalty, refusal) "
    "or module:function.",
    "reward_weights": "One weight per reward source (functions first, then the reward model); empty: all 1.",
    "use_reward_model": "Add the trained reward model as a reward source.",
    "sft_max_steps": "Optimizer steps of SFT.",
    "lr": "Peak learning rate of SFT.",
    "sft_lr": "Peak learning rate of SFT.",
    "dpo_loss": "sigmoid, ipo, hinge, robust, simpo or kto.",
    "dpo_beta": "Strength of the KL constraint (beta).",
    "dpo_max_steps": "Optimizer steps of DPO.",
    "dpo_lr": "Peak learning rate of DPO.",
    "reward_max_steps": "Optimizer steps of reward-model training.",
    "rl_max_steps": "RL steps (one rollout batch and its updates each).",
    "rl_lr": "Peak learning rate of the policy in RL.",
    "rollout_n": "Samples per prompt.",
    "max_new_tokens": "Longest sampled completion.",
    "batch_size": "Per-process micro-batch size of every training stage.",
    "max_length": "Maximum tokens per example (longer rows are dropped in prepare).",
    "eval_fraction": "Fraction of rows held out for evaluation when the data has no eval split.",
    "seed": "Seed for data generation, splits, initialisation, data order and sampling.",
    "gpus_per_step": "Accelerators (and training processes, torchrun) per training step; under kfp.local, CPU "
    "processes.",
    "accelerator_type": "Kubernetes resource name of the accelerator training steps request.",
    "nodes_per_step": "Nodes per training step: > 1 runs each training stage as a Kubeflow Trainer TrainJob of "
    "that many nodes x gpus_per_step processes (needs an object-store pipeline root).",
    "gate_rules": "Release rules such as 'harmless_rate>=0.8' or 'task_pass_rate>=baseline'.",
    "release_uri": "Where a model that passed the gate is published (s3:// or a path); empty: the release artifact.",
    "model_name": "Name of the served model in the Triton repository (/v2/models/<name>/generate).",
    "deploy_variant": "Which export Triton serves: int8 or fp32.",
    "model_repository": "Triton model repository root (s3:// prefix the server reads); empty: the deploy artifact.",
    "triton_url": "HTTP URL of a Triton server (explicit model control) to load the new version on; empty: only "
    "publish the repository.",
    "export_overrides": "'key=value' strings for 'posttrain export', e.g. int4=true.",
    "humaneval_limit": "HumanEval problems to evaluate (0: all 164).",
    "eval_tasks": "Held-out code tasks for the gate (prompt, tests, entry_point; file, dir, hub id or s3://); "
    "empty: the demo's. HumanEval is always evaluated too.",
    "eval_safety": "Held-out safety prompts for the gate (prompt, kind harmful|benign); empty: the demo's.",
    "sft_config_yaml": "YAML text with any 'posttrain sft' keys; the typed parameters override it.",
    "sft_overrides": "'key=value' strings for 'posttrain sft', e.g. lora.r=8; they override everything else.",
    "prepare_overrides": "'key=value' strings for 'posttrain prepare', e.g. max_rows=1000.",
    "dpo_overrides": "'key=value' strings for 'posttrain dpo', e.g. lora.r=8.",
    "reward_overrides": "'key=value' strings for 'posttrain reward'.",
    "rl_overrides": "'key=value' strings for 'posttrain ppo' or 'posttrain grpo'.",
    "evaluate_overrides": "'key=value' strings for 'posttrain evaluate'.",
    "demo_overrides": "Embedded demo only: 'key=value' strings for 'posttrain demo-data' (e.g. n_code_train=500).",
    "tiny_model_overrides": "Embedded demo only: 'key=value' strings for 'posttrain tiny-model' "
    "(e.g. hidden_size=64, num_layers=2).",
}


def documented(summary: str):
    """Give a pipeline function its docstring: ``summary`` and the Args of PARAMETER_DOCS (KFP reads them)."""

    def decorate(func):
        names = list(inspect.signature(func).parameters)
        func.__doc__ = summary + "\n\nArgs:\n" + "\n".join(f"    {n}: {PARAMETER_DOCS[n]}" for n in names)
        return func

    return decorate


def step_settings(params: dict) -> tuple[dict, dict, dict, dict]:
    """A gated DAG's parameters as the keyword groups its steps take: every training step's
    (batch, length, seed), the cluster's (accelerators, nodes), the evaluation's and the serving's."""
    p = params
    return (
        dict(batch_size=p["batch_size"], max_length=p["max_length"], seed=p["seed"]),
        dict(accelerator_type=p["accelerator_type"], gpus=p["gpus_per_step"], nodes=p["nodes_per_step"]),
        dict(
            gate_rules=p["gate_rules"],
            humaneval_limit=p["humaneval_limit"],
            seed=p["seed"],
            overrides=p["evaluate_overrides"],
            tasks_path=p["eval_tasks"],
            safety_path=p["eval_safety"],
        ),
        dict(
            model_name=p["model_name"],
            deploy_variant=p["deploy_variant"],
            model_repository=p["model_repository"],
            triton_url=p["triton_url"],
            export_overrides=p["export_overrides"],
        ),
    )


def start(base_model: str, dataset: str, seed: int, demo_overrides: list, tiny_model_overrides: list, **datasets):
    """The tasks every DAG begins with: check every stage config of this run (on the cluster), then
    bootstrap, keyed for the cache by the content of the given locations."""
    checked = configure(check_config(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER), "check config")
    content = configure(
        fingerprint(base_model=base_model, dataset=dataset, **datasets).after(checked), "fingerprint sources"
    )
    return configure(
        bootstrap(
            base_model=base_model,
            dataset=dataset,
            seed=seed,
            demo_overrides=demo_overrides,
            tiny_model_overrides=tiny_model_overrides,
            sources_fingerprint=content.output,
            **datasets,
        ),
        "bootstrap",
    )


def prepare_and_train(
    stage: str,
    title: str,
    model,
    data,
    *,
    max_length,
    seed,
    accelerator_type,
    gpus,
    prepare_overrides=[],
    eval_fraction: float = 0.05,
    **training,
):
    """Validate, normalize and split ``data`` for ``stage`` (``prepare``), then train ``model`` on it
    with ``gpus`` accelerators (and processes) of ``accelerator_type``."""
    prepared = configure(
        prepare(
            data=data,
            model=model,
            max_length=max_length,
            eval_fraction=eval_fraction,
            seed=seed,
            overrides=prepare_overrides,
        ),
        f"prepare {title} data",
    )
    return configure(
        train(
            stage=stage,
            model=model,
            data=prepared.outputs["prepared"],
            max_length=max_length,
            checkpoint_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            gpus=gpus,
            seed=seed,
            **training,
        ),
        title,
        accelerator=accelerator_type,
        gpus=gpus,
    )


def export_and_deploy(
    model, gate_passed, label: str, model_name, deploy_variant, model_repository, triton_url, export_overrides
):
    """ONNX export, INT8 and parity (only when the gate passed), then the next Triton version."""
    exported = configure(export(model=model, gate_passed=gate_passed, overrides=export_overrides), f"export {label}")
    configure(
        deploy(
            exported=exported.outputs["exported"],
            model_name=model_name,
            variant=deploy_variant,
            repository_uri=model_repository,
            triton_url=triton_url,
        ),
        f"deploy {label}",
    )


def evaluate_and_release(
    boot,
    candidate,
    baseline,
    candidate_label: str,
    judging: dict,
    release_uri,
    serving: dict,
    extra=None,
    extra_label: str = "extra",
    reward_model=None,
):
    """Evaluate candidate vs baseline (and the base model); if the gate passed, release, export and deploy it.

    ``judging``: the evaluate task's settings (gate rules, eval sets, seed, overrides). A plain function,
    not a sub-pipeline, so it can sit inside a ``dsl.If`` branch locally too.
    """
    optional = {"extra_model": extra, "reward_model": reward_model}
    judged = configure(
        evaluate(
            candidate=candidate,
            baseline=baseline,
            eval_data=boot.outputs["demo"],
            base_model=boot.outputs["model"],
            candidate_label=candidate_label,
            baseline_label="sft",
            extra_label=extra_label,
            **judging,
            **{k: v for k, v in optional.items() if v is not None},
        ),
        f"evaluate {candidate_label}",
    )
    configure(
        release(
            model=candidate,
            results=judged.outputs["results"],
            gate_passed=judged.outputs["gate_passed"],
            release_uri=release_uri,
        ),
        f"release {candidate_label}",
    )
    export_and_deploy(candidate, judged.outputs["gate_passed"], candidate_label, **serving)
    return judged


@dsl.pipeline(name="posttrain-sft")
@documented(
    "Supervised fine-tuning: bootstrap -> prepare -> sft -> export -> deploy. Empty base_model and dataset "
    "run the demo."
)
def posttrain_sft(
    base_model: str = "",
    dataset: str = "",
    sft_max_steps: int = 200,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    eval_fraction: float = 0.05,
    seed: int = 0,
    gpus_per_step: int = 1,
    accelerator_type: str = "nvidia.com/gpu",
    nodes_per_step: int = 1,
    sft_config_yaml: str = "",
    sft_overrides: list = [],
    prepare_overrides: list = [],
    model_name: str = "posttrain",
    deploy_variant: str = "int8",
    model_repository: str = "",
    triton_url: str = "",
    export_overrides: list = [],
    demo_overrides: list = [],
    tiny_model_overrides: list = [],
) -> Outputs:
    boot = start(base_model, dataset, seed, demo_overrides, tiny_model_overrides)
    tuned = prepare_and_train(
        "sft",
        "SFT",
        boot.outputs["model"],
        boot.outputs["data"],
        max_steps=sft_max_steps,
        lr=lr,
        batch_size=batch_size,
        max_length=max_length,
        eval_fraction=eval_fraction,
        seed=seed,
        config_yaml=sft_config_yaml,
        overrides=sft_overrides,
        prepare_overrides=prepare_overrides,
        accelerator_type=accelerator_type,
        gpus=gpus_per_step,
        nodes=nodes_per_step,
    )
    export_and_deploy(
        tuned.outputs["output_model"],
        True,
        "SFT",
        model_name=model_name,
        deploy_variant=deploy_variant,
        model_repository=model_repository,
        triton_url=triton_url,
        export_overrides=export_overrides,
    )
    return Outputs(model=tuned.outputs["output_model"], metrics=tuned.outputs["metrics"])


@dsl.pipeline(name="posttrain-dpo")
@documented("SFT then DPO (or IPO, hinge, robust, SimPO, KTO), evaluated against SFT and released if the gate passes.")
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
    gpus_per_step: int = 1,
    accelerator_type: str = "nvidia.com/gpu",
    nodes_per_step: int = 1,
    gate_rules: list = DEFAULT_GATE,
    release_uri: str = "",
    humaneval_limit: int = 0,
    eval_tasks: str = "",
    eval_safety: str = "",
    model_name: str = "posttrain",
    deploy_variant: str = "int8",
    model_repository: str = "",
    triton_url: str = "",
    export_overrides: list = [],
    sft_overrides: list = [],
    dpo_overrides: list = [],
    evaluate_overrides: list = [],
    demo_overrides: list = [],
    tiny_model_overrides: list = [],
):
    boot = start(base_model, dataset, seed, demo_overrides, tiny_model_overrides, preference_dataset=preference_dataset)
    common, cluster, judging, serving = step_settings(locals())
    sft = prepare_and_train(
        "sft",
        "SFT",
        boot.outputs["model"],
        boot.outputs["data"],
        max_steps=sft_max_steps,
        lr=sft_lr,
        overrides=sft_overrides,
        **common,
        **cluster,
    ).outputs["output_model"]
    dpo = prepare_and_train(
        "dpo",
        "DPO",
        sft,
        boot.outputs["preferences"],
        max_steps=dpo_max_steps,
        lr=dpo_lr,
        params={"loss": dpo_loss, "beta": dpo_beta},
        overrides=dpo_overrides,
        **common,
        **cluster,
    ).outputs["output_model"]
    evaluate_and_release(boot, dpo, sft, "dpo", judging, release_uri, serving)


@dsl.pipeline(name="posttrain-rlhf")
@documented("SFT, a reward model, then PPO or GRPO/RLOO with the reward model and reward functions; gated release.")
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
    gpus_per_step: int = 1,
    accelerator_type: str = "nvidia.com/gpu",
    nodes_per_step: int = 1,
    gate_rules: list = DEFAULT_GATE,
    release_uri: str = "",
    humaneval_limit: int = 0,
    eval_tasks: str = "",
    eval_safety: str = "",
    model_name: str = "posttrain",
    deploy_variant: str = "int8",
    model_repository: str = "",
    triton_url: str = "",
    export_overrides: list = [],
    sft_overrides: list = [],
    reward_overrides: list = [],
    rl_overrides: list = [],
    evaluate_overrides: list = [],
    demo_overrides: list = [],
    tiny_model_overrides: list = [],
):
    boot = start(
        base_model,
        dataset,
        seed,
        demo_overrides,
        tiny_model_overrides,
        preference_dataset=preference_dataset,
        prompt_dataset=prompt_dataset,
    )
    common, cluster, judging, serving = step_settings(locals())
    sft = prepare_and_train(
        "sft",
        "SFT",
        boot.outputs["model"],
        boot.outputs["data"],
        max_steps=sft_max_steps,
        lr=sft_lr,
        overrides=sft_overrides,
        **common,
        **cluster,
    ).outputs["output_model"]
    scorer = prepare_and_train(
        "reward",
        "reward model",
        sft,
        boot.outputs["preferences"],
        max_steps=reward_max_steps,
        overrides=reward_overrides,
        **common,
        **cluster,
    ).outputs["output_model"]
    rollouts = {"rollout.n": rollout_n, "rollout.max_new_tokens": max_new_tokens}

    def rl_then_release(algorithm: str, reward_model=None):
        """One RL branch: train the policy from SFT, evaluate it against SFT, release if it passed."""
        sources = {"reward_model": reward_model} if reward_model is not None else {}
        policy = configure(
            train(
                stage=algorithm,
                model=sft,
                data=boot.outputs["prompts"],
                max_steps=rl_max_steps,
                checkpoint_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
                gpus=gpus_per_step,
                nodes=nodes_per_step,
                lr=rl_lr,
                params=rollouts,
                reward_functions=reward_functions,
                reward_weights=reward_weights,
                overrides=rl_overrides,
                **sources,
                **common,
            ),
            algorithm.upper(),
            accelerator=accelerator_type,
            gpus=gpus_per_step,
        )
        evaluate_and_release(
            boot, policy.outputs["output_model"], sft, algorithm, judging, release_uri, serving, reward_model=scorer
        )

    for algorithm in ("ppo", "grpo"):
        with dsl.If(rl_algorithm == algorithm, name=algorithm):
            with dsl.If(use_reward_model == True, name=f"{algorithm} with reward model"):  # noqa: E712
                rl_then_release(algorithm, scorer)
            with dsl.Else(name=f"{algorithm} with reward functions only"):
                rl_then_release(algorithm)


@dsl.pipeline(name="posttrain-all")
@documented(
    "SFT, then DPO and a reward model, then GRPO from the DPO model; one evaluation of base, SFT, DPO "
    "and GRPO; gated release of GRPO."
)
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
    gpus_per_step: int = 1,
    accelerator_type: str = "nvidia.com/gpu",
    nodes_per_step: int = 1,
    gate_rules: list = DEFAULT_GATE,
    release_uri: str = "",
    humaneval_limit: int = 0,
    eval_tasks: str = "",
    eval_safety: str = "",
    model_name: str = "posttrain",
    deploy_variant: str = "int8",
    model_repository: str = "",
    triton_url: str = "",
    export_overrides: list = [],
    sft_overrides: list = [],
    dpo_overrides: list = [],
    reward_overrides: list = [],
    rl_overrides: list = [],
    evaluate_overrides: list = [],
    demo_overrides: list = [],
    tiny_model_overrides: list = [],
):
    boot = start(
        base_model,
        dataset,
        seed,
        demo_overrides,
        tiny_model_overrides,
        preference_dataset=preference_dataset,
        prompt_dataset=prompt_dataset,
    )
    common, cluster, judging, serving = step_settings(locals())
    sft = prepare_and_train(
        "sft",
        "SFT",
        boot.outputs["model"],
        boot.outputs["data"],
        max_steps=sft_max_steps,
        lr=sft_lr,
        overrides=sft_overrides,
        **common,
        **cluster,
    ).outputs["output_model"]
    dpo = prepare_and_train(
        "dpo",
        "DPO",
        sft,
        boot.outputs["preferences"],
        max_steps=dpo_max_steps,
        lr=dpo_lr,
        params={"loss": dpo_loss},
        overrides=dpo_overrides,
        **common,
        **cluster,
    ).outputs["output_model"]
    scorer = prepare_and_train(
        "reward",
        "reward model",
        sft,
        boot.outputs["preferences"],
        max_steps=reward_max_steps,
        overrides=reward_overrides,
        **common,
        **cluster,
    ).outputs["output_model"]
    rollouts = {"rollout.n": rollout_n, "rollout.max_new_tokens": max_new_tokens}
    # RL continues from the DPO model (SFT -> DPO -> RL with a verifiable reward, as Tulu 3 orders them):
    # the policy keeps the refusals preference training taught, and RL adds what only running the code can
    policy = configure(
        train(
            stage="grpo",
            model=dpo,
            data=boot.outputs["prompts"],
            reward_model=scorer,
            checkpoint_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            gpus=gpus_per_step,
            nodes=nodes_per_step,
            reward_functions=reward_functions,
            max_steps=rl_max_steps,
            lr=rl_lr,
            params=rollouts,
            overrides=rl_overrides,
            **common,
        ),
        "GRPO",
        accelerator=accelerator_type,
        gpus=gpus_per_step,
    )
    evaluate_and_release(
        boot,
        policy.outputs["output_model"],
        sft,
        "grpo",
        judging,
        release_uri,
        serving,
        extra=dpo,
        extra_label="dpo",
        reward_model=scorer,
    )


#: name -> pipeline; the CLI and the compile test iterate over this.
PIPELINES = {p.name: p for p in (posttrain_sft, posttrain_dpo, posttrain_rlhf, posttrain_all)}
