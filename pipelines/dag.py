"""The top-level pipelines, and the registry the CLI compiles, runs and submits.

    posttrain-sft    bootstrap -> prepare -> [tune ->] SFT -> export -> deploy
    posttrain-dpo    bootstrap -> prepare -> SFT -> prepare -> [tune ->] DPO -> export -> evaluate -> release, deploy
    posttrain-rlhf   bootstrap -> prepare -> SFT -> prepare -> reward model -> PPO | GRPO -> export -> evaluate
                     -> release, deploy
    posttrain-all    bootstrap -> prepare -> SFT -> prepare -> [tune ->] DPO -> GRPO (from DPO; prepare ->
                     reward model beside it) -> export -> evaluate (all) -> release, deploy
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

A search file in ``dpo_search`` (``posttrain-dpo``, ``-all``) or ``sft_search`` (``posttrain-sft``) adds a ``tune``
task before that stage: it runs the search's trials in its own pod and hands the stage its best config
(:func:`searched`, components/tune.py). It is a parameter of the DAGs rather than a pipeline of its own, so
that a scheduled run re-tunes with the rest of its inputs, and a run without it takes the branch it always
took. What follows the tuned stage is built in both branches (a search and none), since KFP cannot join them.

Every DAG starts with ``bootstrap``: with ``base_model`` and ``dataset`` left empty it runs
the embedded demo (bundled data, a tiny model trained from scratch); otherwise it passes the
given locations through without copying. The DAGs are composed from small named steps, plain
functions (:func:`prepare_and_train`, :func:`evaluate_and_release`) rather than sub-pipelines, so
they work inside ``dsl.If`` branches under ``kfp.local`` too.

Every pipeline parameter is declared once, in ``components/parameters.py``; a pipeline names those it
takes (:func:`declared`), begins as every DAG does (:func:`start`) and builds the rest from the
:class:`Run` it gets. To add a pipeline, write it here and list it in ``PIPELINES``; ``posttrain pipeline
compile`` then writes ``pipelines/compiled/<name>.yaml``.
"""

import contextlib
import contextvars
import types
from typing import NamedTuple

from kfp import dsl

from components.bootstrap import bootstrap
from components.check import check_config
from components.deploy import deploy
from components.evaluate import evaluate
from components.export import export
from components.fingerprint import check_changes, fingerprint, record_inputs
from components.notify import notify
from components.parameters import pipeline_docstring, pipeline_signature
from components.prepare import prepare
from components.release import release
from components.train import train
from components.tune import tune
from pipelines.settings import configure, export_sizing_task, sizing_task

#: The parameters every pipeline takes (components/parameters.py declares each one): the sources and settings
#: of SFT, the shape of every training step and where it runs, what is served, the embedded demo, who is told.
COMMON = (
    "base_model",
    "dataset",
    "sft_max_steps",
    "sft_lr",
    "sft_overrides",
    "prepare_overrides",
    "batch_size",
    "max_length",
    "seed",
    "gpus_per_step",
    "accelerator_type",
    "nodes_per_step",
    "model_name",
    "deploy_variant",
    "model_repository",
    "triton_url",
    "export_overrides",
    "demo_overrides",
    "tiny_model_overrides",
    "notify_webhook",
)
#: ... those of the pipelines that judge their candidate and release it (and may skip a run with nothing new),
RELEASING = (
    "preference_dataset",
    "gate_rules",
    "served_gate_rules",
    "release_uri",
    "humaneval_limit",
    "eval_tasks",
    "eval_safety",
    "evaluate_overrides",
    "skip_if_unchanged",
)
#: ... of DPO, and of a reward model and RL.
DPO = ("dpo_loss", "dpo_max_steps", "dpo_lr", "dpo_overrides", "dpo_search")
RL = (
    "prompt_dataset",
    "reward_functions",
    "reward_max_steps",
    "reward_overrides",
    "rl_max_steps",
    "rl_lr",
    "rollout_n",
    "max_new_tokens",
    "rl_overrides",
)
#: Renamed parameters, by pipeline: old name -> new name. ``posttrain pipeline run|submit|schedule`` still take
#: the old name, with a warning; the compiled pipelines know only the new one.
RENAMED = {"posttrain-sft": {"lr": "sft_lr"}}


#: The arguments of the pipeline function being built (its parameters, as KFP channels), by name.
BUILDING: contextvars.ContextVar[dict] = contextvars.ContextVar("BUILDING")
#: While a pipeline is built: ``stack`` (groups that close when its function returns: the branch that runs
#: only when the inputs changed) and ``fingerprint`` (the run's ``fingerprint sources`` task).
SCOPE: contextvars.ContextVar[dict] = contextvars.ContextVar("SCOPE")


class Run(types.SimpleNamespace):
    """A pipeline while KFP builds it: each of its parameters by name (KFP channels: ``run.sft_lr``), and what
    every DAG starts with (:func:`start`): ``boot``, the bootstrap task; the ``training``, ``cluster`` and
    ``serving`` settings of its steps; and ``judging`` where the pipeline evaluates its candidate (else None)."""


def declared(summary: str, takes: tuple, defaults: dict | None = None):
    """Make ``func(run)`` a pipeline function KFP can read. Its parameters are the declared ones named in
    ``takes`` (components/parameters.py: each with its type, default and doc; ``defaults`` replace declared
    defaults where this pipeline needs another), its docstring is ``summary`` and their docs. While KFP builds
    it, every task runs inside the run's exit handler (:func:`notified`), and ``func`` gets the :class:`Run`
    that :func:`start` began."""
    signature = pipeline_signature(takes, defaults)

    def decorate(func):
        def build(*args, **kwargs):
            given = dict(signature.bind(*args, **kwargs).arguments)
            token = BUILDING.set(given)
            try:
                with notified(func.__name__.replace("_", "-")), contextlib.ExitStack() as stack:
                    scope = SCOPE.set({"stack": stack})
                    try:
                        return func(start(given))
                    finally:
                        SCOPE.reset(scope)
            finally:
                BUILDING.reset(token)

        build.__name__ = build.__qualname__ = func.__name__
        build.__module__ = func.__module__
        build.__signature__ = signature  # what KFP reads a pipeline's inputs from (inspect.signature)
        build.__doc__ = pipeline_docstring(summary, signature.parameters)
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


def start(given: dict) -> Run:
    """What every DAG begins with: check every stage config of this run (on the cluster), then bootstrap,
    keyed for the cache by the content of the given locations; and the settings its steps share. ``given``
    are the pipeline's parameters: the check gets them all, and the DAG itself (:func:`carry_spec`), to
    check the run even where the KFP API cannot be read."""
    run = Run(**given)
    accepted = check_config.component_spec.inputs  # (not the run's notify_webhook: no stage reads it)
    checked = configure(
        check_config(
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            compiled_spec="",
            **{name: value for name, value in given.items() if name in accepted},
        ),
        "check config",
    )
    sources = {name: value for name, value in given.items() if name in SOURCE_PARAMETERS}
    content = configure(fingerprint(**sources).after(checked), "fingerprint sources")
    only_if_changed(given, content, checked)
    run.boot = configure(
        bootstrap(
            seed=run.seed,
            demo_overrides=run.demo_overrides,
            tiny_model_overrides=run.tiny_model_overrides,
            sources_fingerprint=content.output,
            **sources,
        ),
        "bootstrap",
    )
    run.training = Training(run.batch_size, run.max_length, run.seed)
    sizing = sizing_task(run.gpus_per_step, run.nodes_per_step, run.boot)
    run.cluster = Cluster(run.accelerator_type, run.gpus_per_step, run.nodes_per_step, sizing)
    run.serving = Serving(
        run.model_name, run.deploy_variant, run.model_repository, run.triton_url, run.export_overrides
    )
    run.judging = None
    if "gate_rules" in given:
        run.judging = Judging(
            run.gate_rules,
            run.served_gate_rules,
            run.humaneval_limit,
            run.seed,
            run.evaluate_overrides,
            run.eval_tasks,
            run.eval_safety,
        )
    return run


def fine_tune(run: Run, **settings) -> dsl.PipelineTask:
    """SFT of the bootstrap's model on its data, as every DAG begins; ``settings``: more of the step's own."""
    return prepare_and_train(
        "sft",
        "SFT",
        run.boot.outputs["model"],
        run.boot.outputs["data"],
        run.training,
        run.cluster,
        max_steps=run.sft_max_steps,
        lr=run.sft_lr,
        overrides=run.sft_overrides,
        prepare_overrides=run.prepare_overrides,
        **settings,
    )


def preference_tune(run: Run, sft, params: dict, search=None) -> dsl.PipelineTask:
    """DPO (``params``: its loss and beta) of the SFT model on the bootstrap's preference pairs; with ``search``
    (the run's ``dpo_search``), after a search that hands it its best config."""
    return prepare_and_train(
        "dpo",
        "DPO",
        sft,
        run.boot.outputs["preferences"],
        run.training,
        run.cluster,
        max_steps=run.dpo_max_steps,
        lr=run.dpo_lr,
        params=params,
        overrides=run.dpo_overrides,
        prepare_overrides=run.prepare_overrides,
        search=search,
    )


def reward_model(run: Run, sft):
    """The reward model, trained from the SFT model on the bootstrap's preference pairs; its Model output."""
    return prepare_and_train(
        "reward",
        "reward model",
        sft,
        run.boot.outputs["preferences"],
        run.training,
        run.cluster,
        max_steps=run.reward_max_steps,
        overrides=run.reward_overrides,
        prepare_overrides=run.prepare_overrides,
    ).outputs["output_model"]


def reinforce(run: Run, algorithm: str, start, **sources) -> dsl.PipelineTask:
    """RL (ppo or grpo) of ``start`` on the bootstrap's prompts; ``sources``: the reward model and weights."""
    return train_policy(
        algorithm,
        start,
        run.boot.outputs["prompts"],
        run.training,
        run.cluster,
        max_steps=run.rl_max_steps,
        lr=run.rl_lr,
        params={"rollout.n": run.rollout_n, "rollout.max_new_tokens": run.max_new_tokens},
        reward_functions=run.reward_functions,
        overrides=run.rl_overrides,
        **sources,
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
    search=None,
    **settings,
):
    """Validate, normalize and split ``data`` for ``stage`` (``prepare``), then train ``model`` on it
    where ``cluster`` says; ``settings`` are the train component's own (max_steps, lr, overrides...).
    With ``search`` (a search file), a ``tune`` task first searches the stage's keys on the same model, data
    and settings, and the training task trains with the best config it found (components/tune.py)."""
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
    tuned = {}
    if search is not None:  # sized as a training step: its trials train on the pod's accelerators
        searching = tune(
            stage=stage, search=search, model=model, data=prepared.outputs["prepared"], **training._asdict(), **settings
        )
        searching = configure(searching, f"tune {title}", accelerator=cluster.accelerator_type, sizing=cluster.sizing)
        tuned = {"tuned": searching.outputs["best_config"]}
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
            **tuned,
            **settings,
        ),
        title,
        accelerator=cluster.accelerator_type,
        sizing=cluster.sizing,
    )


def searched(search, title: str, build) -> None:
    """``build(search)`` in a branch taken when the run gives ``search`` (a search file: a ``tune`` task runs
    before the stage and hands it its best config), ``build()`` in one taken when it does not, so a run
    without a search runs the DAG it always did. Everything after the tuned stage is built in both branches:
    what either branch trained cannot be joined again after them (``dsl.OneOf`` over artifacts is in neither
    kfp.local nor the Argo translation), as ``posttrain-rlhf`` builds a branch per algorithm."""
    with dsl.If(search != "", name=f"{title} search"):
        build(search)
    with dsl.Else(name=f"no {title} search"):
        build()


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
    run: Run,
    trained: dsl.PipelineTask,
    baseline,
    candidate_label: str,
    extra=None,
    extra_label: str = "extra",
    reward_model=None,
):
    """Export the candidate (``trained``'s model), evaluate it and the variant to be served against the
    baseline (and the base model); if the gate passed, release the candidate and deploy the export.

    A plain function, not a sub-pipeline, so it can sit inside a ``dsl.If`` branch locally too.
    """
    boot, judging, serving, cluster, release_uri = run.boot, run.judging, run.serving, run.cluster, run.release_uri
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
@declared(
    "Supervised fine-tuning: bootstrap -> prepare -> sft -> export -> deploy. Empty base_model and dataset "
    "run the demo.",
    takes=(*COMMON, "eval_fraction", "sft_config_yaml", "sft_search"),
)
def posttrain_sft(run: Run):
    def sft_then_deploy(search=None):
        """SFT (after a search when ``search`` is given), exported and deployed."""
        tuned = fine_tune(run, eval_fraction=run.eval_fraction, config_yaml=run.sft_config_yaml, search=search)
        deploy_export(export_candidate(tuned, "SFT", run.serving, run.cluster), True, "SFT", run.serving)

    searched(run.sft_search, "SFT", sft_then_deploy)
    # (no pipeline outputs: KFP takes them only from outside the ExitHandler that every task runs in; the
    # model and metrics are the SFT task's, and `posttrain pipeline run` links them from runs/latest)


@dsl.pipeline(name="posttrain-dpo")
@declared(
    "SFT then DPO (or IPO, hinge, robust, SimPO, KTO), evaluated against SFT and released if the gate passes.",
    takes=(*COMMON, *RELEASING, *DPO, "dpo_beta"),
)
def posttrain_dpo(run: Run):
    sft = fine_tune(run).outputs["output_model"]

    def dpo_then_release(search=None):
        """DPO (after a search when ``search`` is given), evaluated against SFT, released if it passed."""
        dpo = preference_tune(run, sft, {"loss": run.dpo_loss, "beta": run.dpo_beta}, search)
        evaluate_and_release(run, dpo, sft, "dpo")

    searched(run.dpo_search, "DPO", dpo_then_release)


@dsl.pipeline(name="posttrain-rlhf")
@declared(
    "SFT, a reward model, then PPO or GRPO/RLOO with the reward model and reward functions; gated release.",
    takes=(*COMMON, *RELEASING, *RL, "rl_algorithm", "reward_weights", "use_reward_model"),
)
def posttrain_rlhf(run: Run):
    sft = fine_tune(run).outputs["output_model"]
    scorer = reward_model(run, sft)

    def rl_then_release(algorithm: str, **sources):
        """One RL branch: train the policy from SFT, evaluate it against SFT, release if it passed."""
        policy = reinforce(run, algorithm, sft, reward_weights=run.reward_weights, **sources)
        evaluate_and_release(run, policy, sft, algorithm, reward_model=scorer)

    for algorithm in ("ppo", "grpo"):
        with dsl.If(run.rl_algorithm == algorithm, name=algorithm):
            with dsl.If(run.use_reward_model == True, name=f"{algorithm} with reward model"):  # noqa: E712
                rl_then_release(algorithm, reward_model=scorer)
            with dsl.Else(name=f"{algorithm} with reward functions only"):
                rl_then_release(algorithm)


@dsl.pipeline(name="posttrain-all")
@declared(
    "SFT, then DPO and a reward model, then GRPO from the DPO model; one evaluation of base, SFT, DPO "
    "and GRPO; gated release of GRPO.",
    takes=(*COMMON, *RELEASING, *DPO, *RL),
)
def posttrain_all(run: Run):
    sft = fine_tune(run).outputs["output_model"]
    scorer = reward_model(run, sft)

    def dpo_then_rl(search=None):
        """DPO (after a search when ``search`` is given), GRPO from it, one evaluation, the gated release."""
        dpo = preference_tune(run, sft, {"loss": run.dpo_loss}, search).outputs["output_model"]
        # RL continues from the DPO model (SFT -> DPO -> RL with a verifiable reward, as Tulu 3 orders them):
        # the policy keeps the refusals preference training taught, and RL adds what only running the code can
        policy = reinforce(run, "grpo", dpo, reward_model=scorer)
        evaluate_and_release(run, policy, sft, "grpo", extra=dpo, extra_label="dpo", reward_model=scorer)

    searched(run.dpo_search, "DPO", dpo_then_rl)


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
