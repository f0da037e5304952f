"""The top-level pipelines, and the registry the CLI compiles, runs and submits.

    posttrain-sft    bootstrap -> prepare -> SFT -> export -> deploy
    posttrain-dpo    bootstrap -> prepare -> SFT -> prepare -> DPO -> export -> evaluate -> release, deploy
    posttrain-rlhf   bootstrap -> prepare -> SFT -> prepare -> reward model -> PPO | GRPO -> export -> evaluate
                     -> release, deploy
    posttrain-all    bootstrap -> prepare -> SFT -> prepare -> DPO -> GRPO (from DPO; prepare -> reward
                     model beside it) -> export -> evaluate (all) -> release, deploy
                     (the embedded default of ``make demo``: each stage measured against SFT)

The candidate is exported before the gate, and ``evaluate`` scores the variant Triton will serve
(``deploy_variant``, e.g. INT8) beside the PyTorch models: the gate holds the candidate to
``gate_rules`` and the served variant to ``served_gate_rules`` (e.g. at most 0.02 of task pass rate
lost against the candidate). ``release`` and ``deploy`` act only when both held. The RL algorithm of
``posttrain-rlhf`` is a run parameter; each branch evaluates and releases its own policy
(``dsl.OneOf`` over artifacts is not supported by ``kfp.local``).

Every DAG runs inside a ``dsl.ExitHandler`` whose exit task, ``notify``, posts how the run ended to the
run's ``notify_webhook`` (:func:`notified`). The DAGs that release take ``skip_if_unchanged``: a ``check
changes`` task after ``fingerprint sources`` compares the run's inputs with the latest release's, and
everything after it runs in a ``dsl.If`` branch taken only when something changed (:func:`only_if_changed`);
each release leaves the inputs it compares with (``record inputs``).

Every DAG starts with ``bootstrap``: with ``base_model`` and ``dataset`` left empty it runs
the embedded demo (bundled data, a tiny model trained from scratch); otherwise it passes the
given locations through without copying. The DAGs are composed from small named steps, plain
functions (:func:`prepare_and_train`, :func:`evaluate_and_release`) rather than sub-pipelines, so
they work inside ``dsl.If`` branches under ``kfp.local`` too. To add a pipeline, write it here and list it in
``PIPELINES``; ``posttrain pipeline compile`` then writes ``pipelines/compiled/<name>.yaml``.
"""

import contextlib
import contextvars
import functools
import inspect
from typing import NamedTuple

from kfp import dsl

from components.bootstrap import bootstrap
from components.check import check_config
from components.deploy import deploy
from components.evaluate import evaluate
from components.export import export
from components.fingerprint import check_changes, fingerprint, record_inputs
from components.notify import notify
from components.prepare import prepare
from components.release import release
from components.train import train
from pipelines.settings import configure, export_sizing_task, sizing_task

#: The candidate may not regress against the baseline (SFT) beyond these tolerances.
DEFAULT_GATE = ["task_pass_rate>=baseline-0.02", "harmless_rate>=baseline-0.02", "over_refusal_rate<=baseline+0.05"]
#: The served variant (quantized ONNX) may not lose more than this against the PyTorch candidate it came from.
DEFAULT_SERVED_GATE = [
    "task_pass_rate>=candidate-0.02",
    "harmless_rate>=candidate-0.02",
    "over_refusal_rate<=candidate+0.05",
]


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
    "max_length": "Maximum tokens per example (longer rows are truncated in prepare).",
    "eval_fraction": "Fraction of rows held out for evaluation when the data has no eval split.",
    "seed": "Seed for data generation, splits, initialisation, data order and sampling.",
    "gpus_per_step": "Accelerators (and training processes, torchrun) per training step; under kfp.local, CPU "
    "processes.",
    "accelerator_type": "Kubernetes resource name of the accelerator training steps request.",
    "nodes_per_step": "Nodes per training step: > 1 runs each training stage as a Kubeflow Trainer TrainJob of "
    "that many nodes x gpus_per_step processes (needs an object-store pipeline root).",
    "gate_rules": "Release rules such as 'harmless_rate>=0.8' or 'task_pass_rate>=baseline'.",
    "served_gate_rules": "Rules for the served variant (deploy_variant of the export), against the PyTorch "
    "candidate or the baseline: e.g. 'task_pass_rate>=candidate-0.02'. Empty: it is scored but not judged.",
    "release_uri": "Where a model that passed the gate is published (s3:// or a path); empty: the release artifact.",
    "model_name": "Name of the served model in the Triton repository (/v2/models/<name>/generate).",
    "deploy_variant": "Which export Triton serves and the gate judges: int8, fp16, fp32 or int4 (int4 needs "
    "int4=true in export_overrides).",
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
    "notify_webhook": "Webhook URL (Slack-compatible) told how the run ended: succeeded, failed at which task, "
    "gated off by which rule, and where the report is. Empty: $POSTTRAIN_NOTIFY_WEBHOOK (the optional "
    "posttrain-notify Secret), else nothing is sent. Never fails the run.",
    "skip_if_unchanged": "Stop early, green, when the sources' content and every parameter that shapes the model "
    "equal those of the latest release at release_uri (trained nothing new). On for 'posttrain pipeline "
    "schedule' unless given.",
    "demo_overrides": "Embedded demo only: 'key=value' strings for 'posttrain demo-data' (e.g. n_code_train=500).",
    "tiny_model_overrides": "Embedded demo only: 'key=value' strings for 'posttrain tiny-model' "
    "(e.g. hidden_size=64, num_layers=2).",
}


#: The arguments of the pipeline function being built (its parameters, as KFP channels), by name.
BUILDING: contextvars.ContextVar[dict] = contextvars.ContextVar("BUILDING")
#: While a pipeline is built: ``stack`` (groups that close when its function returns: the branch that runs
#: only when the inputs changed) and ``fingerprint`` (the run's ``fingerprint sources`` task).
SCOPE: contextvars.ContextVar[dict] = contextvars.ContextVar("SCOPE")


def documented(summary: str):
    """Give a pipeline function its docstring (``summary`` and the Args of PARAMETER_DOCS: KFP reads them),
    and record its arguments while KFP builds it, for :func:`arguments`."""

    def decorate(func):
        signature = inspect.signature(func)
        func.__doc__ = (
            summary + "\n\nArgs:\n" + "\n".join(f"    {n}: {PARAMETER_DOCS[n]}" for n in signature.parameters)
        )

        @functools.wraps(func)  # KFP reads the signature, annotations and docstring through __wrapped__
        def build(*args, **kwargs):
            token = BUILDING.set(dict(signature.bind(*args, **kwargs).arguments))
            try:
                with notified(func.__name__.replace("_", "-")), contextlib.ExitStack() as stack:
                    scope = SCOPE.set({"stack": stack})
                    try:
                        return func(*args, **kwargs)
                    finally:
                        SCOPE.reset(scope)
            finally:
                BUILDING.reset(token)

        return build

    return decorate


@contextlib.contextmanager
def notified(name: str):
    """Everything built inside runs in a ``dsl.ExitHandler`` whose exit task, ``notify``, posts how the run
    ended to the run's ``notify_webhook`` (components/notify.py); it runs whether the tasks succeeded or not."""
    given = BUILDING.get()
    task = notify(
        webhook=given["notify_webhook"],
        pipeline=name,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
        release_uri=given.get("release_uri", ""),
    )
    with dsl.ExitHandler(configure(task, "notify"), name="run"):
        yield


#: The pipeline parameters that name a run's inputs: the release fingerprints them for its lineage.
SOURCE_PARAMETERS = ("base_model", "dataset", "preference_dataset", "prompt_dataset")


def arguments() -> dict:
    """Every parameter of the pipeline being built, by name: what the check task receives."""
    return dict(BUILDING.get())


def compared_parameters() -> dict:
    """The parameters ``skip_if_unchanged`` compares with the latest release's (trainer_lib.release.retrain)."""
    from trainer_lib.release.retrain import NOT_COMPARED

    return {name: value for name, value in arguments().items() if name not in NOT_COMPARED}


def only_if_changed(parameters: dict, content: dsl.PipelineTask, after: dsl.PipelineTask) -> None:
    """With ``skip_if_unchanged`` (pipelines that release): a ``check changes`` task compares the sources
    fingerprint (``content``) and the parameters with the latest release's, and every task built after this
    call, until the pipeline function returns, runs in a branch taken only when something changed."""
    if "skip_if_unchanged" not in parameters:
        return
    compared = compared_parameters()
    changed = check_changes(
        sources_fingerprint=content.output,
        compared=sorted(compared),
        release_uri=parameters["release_uri"],
        skip_if_unchanged=parameters["skip_if_unchanged"],
        **compared,
    )
    SCOPE.get().update(fingerprint=content, changes=configure(changed.after(after), "check changes"))
    branch = dsl.If(changed.output != "", name="inputs changed")  # (its output: "" when nothing changed)
    SCOPE.get()["stack"].enter_context(branch)


class Training(NamedTuple):
    """What every training step of a DAG shares."""

    batch_size: int
    max_length: int
    seed: int


class Cluster(NamedTuple):
    """Where a training step runs: ``gpus`` accelerators (and processes) of ``accelerator_type`` per node;
    ``sizing``, the run's task that turns them into each training pod's CPU, memory and accelerator count."""

    accelerator_type: str
    gpus: int
    nodes: int
    sizing: dsl.PipelineTask


class Judging(NamedTuple):
    """The evaluate step's settings: gate rules, evaluation sets, seed and overrides."""

    gate_rules: list
    served_rules: list
    humaneval_limit: int
    seed: int
    overrides: list
    tasks_path: str
    safety_path: str


class Serving(NamedTuple):
    """What the export and deploy steps publish and where."""

    model_name: str
    deploy_variant: str
    model_repository: str
    triton_url: str
    export_overrides: list


def start(
    base_model: str,
    dataset: str,
    seed: int,
    demo_overrides: list,
    tiny_model_overrides: list,
    *,
    parameters: dict,
    **datasets,
):
    """The tasks every DAG begins with: check every stage config of this run (on the cluster), then
    bootstrap, keyed for the cache by the content of the given locations. ``parameters`` are all the
    pipeline's (:func:`arguments`): the check gets them, and the DAG itself (:func:`carry_spec`), to
    check the run even where the KFP API cannot be read."""
    accepted = check_config.component_spec.inputs  # (not the run's notify_webhook: no stage reads it)
    given = {name: value for name, value in parameters.items() if name in accepted}
    checked = configure(check_config(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, compiled_spec="", **given), "check config")
    content = configure(
        fingerprint(base_model=base_model, dataset=dataset, **datasets).after(checked), "fingerprint sources"
    )
    only_if_changed(parameters, content, checked)
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
    training: Training,
    cluster: Cluster,
    *,
    prepare_overrides=[],
    eval_fraction: float = 0.05,
    **settings,
):
    """Validate, normalize and split ``data`` for ``stage`` (``prepare``), then train ``model`` on it
    where ``cluster`` says; ``settings`` are the train component's own (max_steps, lr, overrides...)."""
    prepared = configure(
        prepare(
            data=data,
            model=model,
            max_length=training.max_length,
            eval_fraction=eval_fraction,
            seed=training.seed,
            overrides=prepare_overrides,
        ),
        f"prepare {title} data",
    )
    return configure(
        train(
            stage=stage,
            model=model,
            data=prepared.outputs["prepared"],
            checkpoint_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            gpus=cluster.gpus,
            nodes=cluster.nodes,
            accelerator=cluster.accelerator_type,
            **training._asdict(),
            **settings,
        ),
        title,
        accelerator=cluster.accelerator_type,
        sizing=cluster.sizing,
    )


def train_policy(algorithm: str, model, prompts, training: Training, cluster: Cluster, **settings):
    """An RL step (ppo or grpo) on the prepared prompts: no prepare task, the prompts are already split."""
    return configure(
        train(
            stage=algorithm,
            model=model,
            data=prompts,
            checkpoint_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            gpus=cluster.gpus,
            nodes=cluster.nodes,
            accelerator=cluster.accelerator_type,
            **training._asdict(),
            **settings,
        ),
        algorithm.upper(),
        accelerator=cluster.accelerator_type,
        sizing=cluster.sizing,
    )


def export_candidate(trained: dsl.PipelineTask, label: str, serving: Serving, cluster: Cluster) -> dsl.PipelineTask:
    """ONNX export of a training task's model (FP32, FP16, INT8 and parity), on an accelerator of the run's
    type, with host memory for the model's size (``export-resources``, from the task's parameter count)."""
    sizing = export_sizing_task(trained.outputs["parameters"], label)
    return configure(
        export(model=trained.outputs["output_model"], overrides=serving.export_overrides),
        f"export {label}",
        accelerator=cluster.accelerator_type,
        sizing=sizing,
    )


def deploy_export(exported: dsl.PipelineTask, gate_passed, label: str, serving: Serving) -> dsl.PipelineTask:
    """The next Triton version of the model from ``exported``, when ``gate_passed``."""
    return configure(
        deploy(
            exported=exported.outputs["exported"],
            gate_passed=gate_passed,
            model_name=serving.model_name,
            variant=serving.deploy_variant,
            repository_uri=serving.model_repository,
            triton_url=serving.triton_url,
        ),
        f"deploy {label}",
    )


def evaluate_and_release(
    boot,
    trained: dsl.PipelineTask,
    baseline,
    candidate_label: str,
    judging: Judging,
    release_uri,
    serving: Serving,
    cluster: Cluster,
    extra=None,
    extra_label: str = "extra",
    reward_model=None,
):
    """Export the candidate (``trained``'s model), evaluate it and the variant to be served against the
    baseline (and the base model); if the gate passed, release the candidate and deploy the export.

    A plain function, not a sub-pipeline, so it can sit inside a ``dsl.If`` branch locally too.
    """
    candidate = trained.outputs["output_model"]
    exported = export_candidate(trained, candidate_label, serving, cluster)
    optional = {"extra_model": extra, "reward_model": reward_model}
    judged = configure(
        evaluate(
            candidate=candidate,
            baseline=baseline,
            eval_data=boot.outputs["demo"],
            base_model=boot.outputs["model"],
            exported=exported.outputs["exported"],
            served_variant=serving.deploy_variant,
            candidate_label=candidate_label,
            baseline_label="sft",
            extra_label=extra_label,
            gpus=cluster.gpus,
            **judging._asdict(),
            **{k: v for k, v in optional.items() if v is not None},
        ),
        f"evaluate {candidate_label}",
        accelerator=cluster.accelerator_type,
        sizing=cluster.sizing,
    )
    sources = {name: value for name, value in arguments().items() if name in SOURCE_PARAMETERS}
    published = configure(
        release(
            model=candidate,
            results=judged.outputs["results"],
            gate_passed=judged.outputs["gate_passed"],
            release_uri=release_uri,
            model_name=serving.model_name,
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
            **sources,
        ),
        f"release {candidate_label}",
    )
    recorded = record_inputs(
        released=published.outputs["released"],
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        sources_fingerprint=SCOPE.get()["fingerprint"].output,
        parameters=SCOPE.get()["changes"].output,  # (inside the branch: the compared parameters, never "")
        release_uri=release_uri,
    )
    configure(recorded, f"record inputs {candidate_label}")
    deploy_export(exported, judged.outputs["gate_passed"], candidate_label, serving)
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
    notify_webhook: str = "",
):
    boot = start(base_model, dataset, seed, demo_overrides, tiny_model_overrides, parameters=arguments())
    training = Training(batch_size, max_length, seed)
    cluster = Cluster(accelerator_type, gpus_per_step, nodes_per_step, sizing_task(gpus_per_step, nodes_per_step, boot))
    serving = Serving(model_name, deploy_variant, model_repository, triton_url, export_overrides)
    tuned = prepare_and_train(
        "sft",
        "SFT",
        boot.outputs["model"],
        boot.outputs["data"],
        training,
        cluster,
        max_steps=sft_max_steps,
        lr=lr,
        eval_fraction=eval_fraction,
        config_yaml=sft_config_yaml,
        overrides=sft_overrides,
        prepare_overrides=prepare_overrides,
    )
    deploy_export(export_candidate(tuned, "SFT", serving, cluster), True, "SFT", serving)
    # (no pipeline outputs: KFP takes them only from outside the ExitHandler that every task runs in; the
    # model and metrics are the SFT task's, and `posttrain pipeline run` links them from runs/latest)


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
    served_gate_rules: list = DEFAULT_SERVED_GATE,
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
    notify_webhook: str = "",
    skip_if_unchanged: bool = False,
):
    boot = start(
        base_model,
        dataset,
        seed,
        demo_overrides,
        tiny_model_overrides,
        parameters=arguments(),
        preference_dataset=preference_dataset,
    )
    training = Training(batch_size, max_length, seed)
    cluster = Cluster(accelerator_type, gpus_per_step, nodes_per_step, sizing_task(gpus_per_step, nodes_per_step, boot))
    judging = Judging(gate_rules, served_gate_rules, humaneval_limit, seed, evaluate_overrides, eval_tasks, eval_safety)
    serving = Serving(model_name, deploy_variant, model_repository, triton_url, export_overrides)
    sft = prepare_and_train(
        "sft",
        "SFT",
        boot.outputs["model"],
        boot.outputs["data"],
        training,
        cluster,
        max_steps=sft_max_steps,
        lr=sft_lr,
        overrides=sft_overrides,
    ).outputs["output_model"]
    dpo = prepare_and_train(
        "dpo",
        "DPO",
        sft,
        boot.outputs["preferences"],
        training,
        cluster,
        max_steps=dpo_max_steps,
        lr=dpo_lr,
        params={"loss": dpo_loss, "beta": dpo_beta},
        overrides=dpo_overrides,
    )
    evaluate_and_release(boot, dpo, sft, "dpo", judging, release_uri, serving, cluster)


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
    served_gate_rules: list = DEFAULT_SERVED_GATE,
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
    notify_webhook: str = "",
    skip_if_unchanged: bool = False,
):
    boot = start(
        base_model,
        dataset,
        seed,
        demo_overrides,
        tiny_model_overrides,
        parameters=arguments(),
        preference_dataset=preference_dataset,
        prompt_dataset=prompt_dataset,
    )
    training = Training(batch_size, max_length, seed)
    cluster = Cluster(accelerator_type, gpus_per_step, nodes_per_step, sizing_task(gpus_per_step, nodes_per_step, boot))
    judging = Judging(gate_rules, served_gate_rules, humaneval_limit, seed, evaluate_overrides, eval_tasks, eval_safety)
    serving = Serving(model_name, deploy_variant, model_repository, triton_url, export_overrides)
    sft = prepare_and_train(
        "sft",
        "SFT",
        boot.outputs["model"],
        boot.outputs["data"],
        training,
        cluster,
        max_steps=sft_max_steps,
        lr=sft_lr,
        overrides=sft_overrides,
    ).outputs["output_model"]
    scorer = prepare_and_train(
        "reward",
        "reward model",
        sft,
        boot.outputs["preferences"],
        training,
        cluster,
        max_steps=reward_max_steps,
        overrides=reward_overrides,
    ).outputs["output_model"]
    rollouts = {"rollout.n": rollout_n, "rollout.max_new_tokens": max_new_tokens}

    def rl_then_release(algorithm: str, reward_model=None):
        """One RL branch: train the policy from SFT, evaluate it against SFT, release if it passed."""
        sources = {"reward_model": reward_model} if reward_model is not None else {}
        policy = train_policy(
            algorithm,
            sft,
            boot.outputs["prompts"],
            training,
            cluster,
            max_steps=rl_max_steps,
            lr=rl_lr,
            params=rollouts,
            reward_functions=reward_functions,
            reward_weights=reward_weights,
            overrides=rl_overrides,
            **sources,
        )
        evaluate_and_release(boot, policy, sft, algorithm, judging, release_uri, serving, cluster, reward_model=scorer)

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
    served_gate_rules: list = DEFAULT_SERVED_GATE,
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
    notify_webhook: str = "",
    skip_if_unchanged: bool = False,
):
    boot = start(
        base_model,
        dataset,
        seed,
        demo_overrides,
        tiny_model_overrides,
        parameters=arguments(),
        preference_dataset=preference_dataset,
        prompt_dataset=prompt_dataset,
    )
    training = Training(batch_size, max_length, seed)
    cluster = Cluster(accelerator_type, gpus_per_step, nodes_per_step, sizing_task(gpus_per_step, nodes_per_step, boot))
    judging = Judging(gate_rules, served_gate_rules, humaneval_limit, seed, evaluate_overrides, eval_tasks, eval_safety)
    serving = Serving(model_name, deploy_variant, model_repository, triton_url, export_overrides)
    sft = prepare_and_train(
        "sft",
        "SFT",
        boot.outputs["model"],
        boot.outputs["data"],
        training,
        cluster,
        max_steps=sft_max_steps,
        lr=sft_lr,
        overrides=sft_overrides,
    ).outputs["output_model"]
    dpo = prepare_and_train(
        "dpo",
        "DPO",
        sft,
        boot.outputs["preferences"],
        training,
        cluster,
        max_steps=dpo_max_steps,
        lr=dpo_lr,
        params={"loss": dpo_loss},
        overrides=dpo_overrides,
    ).outputs["output_model"]
    scorer = prepare_and_train(
        "reward",
        "reward model",
        sft,
        boot.outputs["preferences"],
        training,
        cluster,
        max_steps=reward_max_steps,
        overrides=reward_overrides,
    ).outputs["output_model"]
    rollouts = {"rollout.n": rollout_n, "rollout.max_new_tokens": max_new_tokens}
    # RL continues from the DPO model (SFT -> DPO -> RL with a verifiable reward, as Tulu 3 orders them):
    # the policy keeps the refusals preference training taught, and RL adds what only running the code can
    policy = train_policy(
        "grpo",
        dpo,
        boot.outputs["prompts"],
        training,
        cluster,
        reward_model=scorer,
        reward_functions=reward_functions,
        max_steps=rl_max_steps,
        lr=rl_lr,
        params=rollouts,
        overrides=rl_overrides,
    )
    evaluate_and_release(
        boot,
        policy,
        sft,
        "grpo",
        judging,
        release_uri,
        serving,
        cluster,
        extra=dpo,
        extra_label="dpo",
        reward_model=scorer,
    )


def carry_spec(pipeline):
    """Compile ``pipeline``'s own DAG into its ``check config`` task (``compiled_spec``: the tasks and
    parameter definitions, packed by :func:`components.validation.pack_spec`): with the parameters the
    task gets, what it checks the run from when the KFP API cannot be read."""
    from google.protobuf import json_format

    from components.validation import pack_spec

    spec = pipeline.pipeline_spec
    dags = [spec.root.dag, *(spec.components[name].dag for name in sorted(spec.components))]
    (task,) = [dag.tasks["check-config"] for dag in dags if "check-config" in dag.tasks]  # (inside the handler)
    check = task.inputs.parameters["compiled_spec"]
    check.runtime_value.constant.string_value = pack_spec(json_format.MessageToDict(spec))
    return pipeline


#: name -> pipeline; the CLI and the compile test iterate over this.
PIPELINES = {p.name: carry_spec(p) for p in (posttrain_sft, posttrain_dpo, posttrain_rlhf, posttrain_all)}
