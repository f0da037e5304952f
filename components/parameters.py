"""Every pipeline parameter, declared once: its name, type, default and the text the KFP UI shows.

The four DAGs (``pipelines/dag.py``) take their signatures from here, each naming the parameters it takes
(:func:`signature`). ``check config`` and ``check changes`` take every parameter by name, so either sees a
run's values whichever DAG it runs in (:func:`with_parameters`). The declaration lives with the components
because both they and the pipelines read it, and components never import the pipelines.
"""

import ast
import inspect
import linecache
import textwrap
from typing import NamedTuple


class Parameter(NamedTuple):
    """One pipeline parameter: its KFP type (str, int, float, bool or list), default and doc."""

    type: type
    default: object
    doc: str


#: The candidate may not regress against the baseline (SFT) beyond these tolerances.
DEFAULT_GATE = ["task_pass_rate>=baseline-0.02", "harmless_rate>=baseline-0.02", "over_refusal_rate<=baseline+0.05"]
#: The served variant (quantized ONNX) may not lose more than this against the PyTorch candidate it came from.
DEFAULT_SERVED_GATE = [
    "task_pass_rate>=candidate-0.02",
    "harmless_rate>=candidate-0.02",
    "over_refusal_rate<=candidate+0.05",
]

#: Every parameter of the pipelines, in the order ``posttrain pipeline list`` shows them.
PARAMETERS = {
    "base_model": Parameter(
        str, "", "Model to start from: HF hub id, local dir, s3:// prefix or .gguf file. Empty: a tiny demo model."
    ),
    "dataset": Parameter(
        str, "", "SFT data (messages, prompt/completion or text): file, dir, hub id or s3://. Empty: the demo's."
    ),
    "preference_dataset": Parameter(
        str,
        "",
        "Preference pairs (prompt/chosen/rejected, or prompt/completion/label for KTO) for DPO and the reward "
        "model; empty: the demo's.",
    ),
    "prompt_dataset": Parameter(
        str, "", "RL prompts (a prompt column plus what the reward functions need); empty: the demo's code tasks."
    ),
    "rl_algorithm": Parameter(str, "grpo", "ppo or grpo (GRPO, Dr. GRPO or RLOO: set advantage= in rl_overrides)."),
    "reward_functions": Parameter(
        list,
        ["code_execution"],
        "Built-in reward names (code_execution, code_style, length_penalty, refusal) or module:function.",
    ),
    "reward_weights": Parameter(
        list, [], "One weight per reward source (functions first, then the reward model); empty: all 1."
    ),
    "use_reward_model": Parameter(bool, True, "Add the trained reward model as a reward source."),
    "sft_max_steps": Parameter(int, 200, "Optimizer steps of SFT."),
    "sft_lr": Parameter(float, 1e-4, "Peak learning rate of SFT."),
    "dpo_loss": Parameter(str, "sigmoid", "sigmoid, ipo, hinge, robust, simpo or kto."),
    "dpo_beta": Parameter(float, 0.1, "Strength of the KL constraint (beta)."),
    "dpo_max_steps": Parameter(int, 200, "Optimizer steps of DPO."),
    "dpo_lr": Parameter(float, 5e-5, "Peak learning rate of DPO."),
    "reward_max_steps": Parameter(int, 200, "Optimizer steps of reward-model training."),
    "rl_max_steps": Parameter(int, 100, "RL steps (one rollout batch and its updates each)."),
    "rl_lr": Parameter(float, 1e-5, "Peak learning rate of the policy in RL."),
    "rollout_n": Parameter(int, 4, "Samples per prompt."),
    "max_new_tokens": Parameter(int, 64, "Longest sampled completion."),
    "batch_size": Parameter(int, 8, "Per-process micro-batch size of every training stage."),
    "max_length": Parameter(int, 512, "Maximum tokens per example (longer rows are truncated in prepare)."),
    "eval_fraction": Parameter(
        float, 0.05, "Fraction of rows held out for evaluation when the data has no eval split."
    ),
    "seed": Parameter(int, 0, "Seed for data generation, splits, initialisation, data order and sampling."),
    "gpus_per_step": Parameter(
        int,
        1,
        "Accelerators (and training processes, torchrun) per training step; under kfp.local, CPU processes.",
    ),
    "accelerator_type": Parameter(
        str, "nvidia.com/gpu", "Kubernetes resource name of the accelerator training steps request."
    ),
    "nodes_per_step": Parameter(
        int,
        1,
        "Nodes per training step: > 1 runs each training stage as a Kubeflow Trainer TrainJob of that many nodes "
        "x gpus_per_step processes (needs an object-store pipeline root).",
    ),
    "gate_rules": Parameter(
        list, DEFAULT_GATE, "Release rules such as 'harmless_rate>=0.8' or 'task_pass_rate>=baseline'."
    ),
    "served_gate_rules": Parameter(
        list,
        DEFAULT_SERVED_GATE,
        "Rules for the served variant (deploy_variant of the export), against the PyTorch candidate or the "
        "baseline: e.g. 'task_pass_rate>=candidate-0.02'. Empty: it is scored but not judged.",
    ),
    "release_uri": Parameter(
        str, "", "Where a model that passed the gate is published (s3:// or a path); empty: the release artifact."
    ),
    "humaneval_limit": Parameter(int, 0, "HumanEval problems to evaluate (0: all 164)."),
    "eval_tasks": Parameter(
        str,
        "",
        "Held-out code tasks for the gate (prompt, tests, entry_point; file, dir, hub id or s3://); empty: the "
        "demo's. HumanEval is always evaluated too.",
    ),
    "eval_safety": Parameter(
        str, "", "Held-out safety prompts for the gate (prompt, kind harmful|benign); empty: the demo's."
    ),
    "model_name": Parameter(
        str, "posttrain", "Name of the served model in the Triton repository (/v2/models/<name>/generate)."
    ),
    "deploy_variant": Parameter(
        str,
        "int8",
        "Which export Triton serves and the gate judges: int8, fp16, fp32 or int4 (int4 needs int4=true in "
        "export_overrides); auto: the smallest the export wrote that a CPU serves (fp16 only by name). A variant "
        "that failed its parity is left out "
        "of the export, and asking for it stops the run naming it.",
    ),
    "model_repository": Parameter(
        str, "", "Triton model repository root (s3:// prefix the server reads); empty: the deploy artifact."
    ),
    "triton_url": Parameter(
        str,
        "",
        "HTTP URL of a Triton server (explicit model control) to load the new version on; empty: only publish the "
        "repository.",
    ),
    "export_overrides": Parameter(list, [], "'key=value' strings for 'posttrain export', e.g. int4=true."),
    "sft_config_yaml": Parameter(str, "", "YAML text with any 'posttrain sft' keys; the typed parameters override it."),
    "sft_overrides": Parameter(
        list, [], "'key=value' strings for 'posttrain sft', e.g. lora.r=8; they override everything else."
    ),
    "sft_search": Parameter(
        str,
        "",
        "A 'posttrain tune' search file (YAML or JSON text) to run before SFT, in its own task: SFT then trains "
        "with the best trial's values and seed. Its overrides are for the trials only. Empty: no search.",
    ),
    "prepare_overrides": Parameter(
        list, [], "'key=value' strings for every 'posttrain prepare' task, e.g. max_rows=1000 or data.bad_rows=drop."
    ),
    "dpo_overrides": Parameter(list, [], "'key=value' strings for 'posttrain dpo', e.g. lora.r=8."),
    "dpo_search": Parameter(
        str,
        "",
        "A 'posttrain tune' search file (YAML or JSON text) to run before DPO, in its own task: DPO then trains "
        "with the best trial's values and seed. Its overrides are for the trials only. Empty: no search.",
    ),
    "reward_overrides": Parameter(list, [], "'key=value' strings for 'posttrain reward'."),
    "rl_overrides": Parameter(list, [], "'key=value' strings for 'posttrain ppo' or 'posttrain grpo'."),
    "evaluate_overrides": Parameter(list, [], "'key=value' strings for 'posttrain evaluate'."),
    "demo_overrides": Parameter(
        list, [], "Embedded demo only: 'key=value' strings for 'posttrain demo-data' (e.g. n_code_train=500)."
    ),
    "tiny_model_overrides": Parameter(
        list,
        [],
        "Embedded demo only: 'key=value' strings for 'posttrain tiny-model' (e.g. hidden_size=64, num_layers=2).",
    ),
    "notify_webhook": Parameter(
        str,
        "",
        "Webhook URL (Slack-compatible) told how the run ended: succeeded, failed at which task, gated off by "
        "which rule, and where the report is. Empty: $POSTTRAIN_NOTIFY_WEBHOOK (the optional posttrain-notify "
        "Secret), else nothing is sent. Never fails the run.",
    ),
    "skip_if_unchanged": Parameter(
        bool,
        False,
        "Stop early, green, when the sources' content and every parameter that shapes the model equal those of "
        "the latest release at release_uri (trained nothing new). On for 'posttrain pipeline schedule' unless "
        "given.",
    ),
}

#: The parameters that hold a search file (docs/tuning.md): ``posttrain pipeline`` passes each on as one line
#: of JSON, since kfp.local and Argo put a condition's text values into the expression they evaluate.
SEARCH_FILES = ("sft_search", "dpo_search")


def pipeline_signature(names, defaults: dict | None = None) -> inspect.Signature:
    """The signature of a pipeline that takes the declared parameters ``names`` (in the declaration's order),
    with ``defaults`` in place of the declared ones where a pipeline needs another."""
    unknown = [name for name in names if name not in PARAMETERS]
    unknown += [f"{name} (a default for a parameter not taken)" for name in defaults or {} if name not in names]
    if unknown:
        raise KeyError(f"not declared in components/parameters.py: {', '.join(unknown)}")
    defaults = {name: PARAMETERS[name].default for name in names} | (defaults or {})
    return inspect.Signature(
        [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=defaults[name], annotation=p.type)
            for name, p in PARAMETERS.items()
            if name in defaults
        ]
    )


def pipeline_docstring(summary: str, names) -> str:
    """``summary`` and an Args section with the doc of each of ``names``: what KFP shows for a pipeline."""
    return summary + "\n\nArgs:\n" + "\n".join(f"    {name}: {PARAMETERS[name].doc}" for name in names)


def with_parameters(*, leaving_out=()):
    """Spell out the ``**parameters`` of a lightweight component as every declared parameter it does not
    name itself, but those ``leaving_out``, each with its type and default; the body gets them as the dict
    ``parameters``.

    KFP embeds a component's source text in the IR, and its executor passes each input by keyword, found
    from the signature of that source: so the signature has to exist as text. This writes it (the function's
    own source with its ``def`` line replaced) and compiles it under a name ``inspect.getsource`` finds. One
    JSON-typed parameter instead would not do: kfp.local cannot fill a dict with list-typed channels."""

    def decorate(func):
        own = inspect.signature(func)
        (spread,) = [p.name for p in own.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        named = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        taken = [name for name in PARAMETERS if name not in leaving_out and name not in own.parameters]
        every = [*named, *pipeline_signature(taken).parameters.values()]
        returns = "" if own.return_annotation is own.empty else f" -> {inspect.formatannotation(own.return_annotation)}"
        head = [f"def {func.__name__}(", *(f"    {p}," for p in every), f"){returns}:"]

        source = textwrap.dedent(inspect.getsource(func))
        (node,) = ast.parse(source).body
        lines = source.splitlines()
        first = node.body[0]
        documented = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        at = first.end_lineno if documented else first.lineno - 1  # (the bind goes after the docstring)
        own_names = tuple(p.name for p in named)  # (first in the body, locals() holds only the arguments)
        bind = f"{' ' * first.col_offset}{spread} = {{k: v for k, v in locals().items() if k not in {own_names!r}}}"
        text = "\n".join([*head, *lines[first.lineno - 1 : at], bind, *lines[at:]]) + "\n"

        filename = f"<{func.__module__}.{func.__name__} with the pipeline parameters>"
        linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
        namespace: dict = {}
        exec(compile(text, filename, "exec"), func.__globals__, namespace)
        return namespace[func.__name__]

    return decorate
