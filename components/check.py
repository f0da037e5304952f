"""check config: the first task of every DAG; checks every stage config this run will build.

``posttrain pipeline run|submit|schedule`` check the configs on the laptop before anything starts. A
run started from the Kubeflow UI, a recurring run or ``kfp run create`` never passes through that
code, so the DAG checks itself: this task reads the run's IR and parameters back from the KFP API and
fails in seconds, naming the task, stage and key, before any pod trains for hours on a typo.

The API is read from ``$POSTTRAIN_KFP_API`` (the ``posttrain-config`` ConfigMap sets it on the
cluster); without it (``kfp.local``, where the CLI already checked) the task only says so. Where the API
cannot be reached or does not let the pod in (multi-user Kubeflow without the ``access-ml-pipeline``
PodDefault), or under plain Argo (``$POSTTRAIN_CHECK_FROM_INPUTS=1``, set by ``pipelines/argo.py``), the task
checks the run from its own inputs: every pipeline parameter (the DAG passes its
parameters here, so these are the values every stage of this run gets; the defaults stand for the
parameters other pipelines have, and are never read) and ``compiled_spec``, the DAG compiled into the
task (``components.validation``).
"""

from kfp import dsl

from components.common import image_for


@dsl.component(base_image=image_for("check-config"), install_kfp_package=False)
def check_config(
    run_id: str,
    compiled_spec: str = "",
    base_model: str = "",
    dataset: str = "",
    preference_dataset: str = "",
    prompt_dataset: str = "",
    rl_algorithm: str = "",
    reward_functions: list = [],
    reward_weights: list = [],
    use_reward_model: bool = False,
    sft_max_steps: int = 0,
    lr: float = 0.0,
    sft_lr: float = 0.0,
    dpo_loss: str = "",
    dpo_beta: float = 0.0,
    dpo_max_steps: int = 0,
    dpo_lr: float = 0.0,
    reward_max_steps: int = 0,
    rl_max_steps: int = 0,
    rl_lr: float = 0.0,
    rollout_n: int = 0,
    max_new_tokens: int = 0,
    batch_size: int = 0,
    max_length: int = 0,
    eval_fraction: float = 0.0,
    seed: int = 0,
    gpus_per_step: int = 0,
    accelerator_type: str = "",
    nodes_per_step: int = 0,
    gate_rules: list = [],
    served_gate_rules: list = [],
    release_uri: str = "",
    model_name: str = "",
    deploy_variant: str = "",
    model_repository: str = "",
    triton_url: str = "",
    export_overrides: list = [],
    humaneval_limit: int = 0,
    eval_tasks: str = "",
    eval_safety: str = "",
    sft_config_yaml: str = "",
    sft_overrides: list = [],
    prepare_overrides: list = [],
    dpo_overrides: list = [],
    reward_overrides: list = [],
    rl_overrides: list = [],
    evaluate_overrides: list = [],
    demo_overrides: list = [],
    tiny_model_overrides: list = [],
) -> int:
    given = dict(locals())  # the pipeline's parameters as this run gives them to every task (and defaults)
    import os
    import sys

    from components.validation import ValidationError, check_inputs, check_task

    host = os.environ.get("POSTTRAIN_KFP_API", "")
    from_inputs = os.environ.get("POSTTRAIN_CHECK_FROM_INPUTS") == "1"  # plain Argo: no KFP API to ask
    if not host and not from_inputs:
        print(
            "POSTTRAIN_KFP_API is not set: the stage configs are not checked here "
            "(posttrain pipeline run/submit/schedule checked them before the run started)"
        )
        return 0
    parameters = {k: v for k, v in given.items() if k not in ("run_id", "compiled_spec")}
    try:
        if host:
            checked, origin = check_task(run_id, host, compiled_spec, parameters)
        else:
            checked, origin = check_inputs(compiled_spec, parameters)
    except (ValidationError, RuntimeError) as exc:
        sys.exit(f"check config: {exc}")
    print(f"run {run_id}: all {checked} stage configs are valid ({origin})")
    return checked
