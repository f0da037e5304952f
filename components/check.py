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
parameters here, so these are the values every stage of this run gets; the declared defaults stand for
the parameters other pipelines have, and are never read) and ``compiled_spec``, the DAG compiled into the
task (``components.validation``). ``with_parameters`` writes the parameters into the signature from their
declaration (``components/parameters.py``), since KFP passes each input by name.
"""

from kfp import dsl

from components.common import image_for
from components.parameters import with_parameters


@dsl.component(base_image=image_for("check-config"), install_kfp_package=False)
@with_parameters(leaving_out=("notify_webhook", "skip_if_unchanged"))  # (no stage config reads them)
def check_config(run_id: str, compiled_spec: str = "", **parameters) -> int:
    """Check every stage config of run ``run_id``: from the KFP API's copy of the run, or from ``parameters``
    (every pipeline parameter, as this run gives them to its tasks) and ``compiled_spec`` (the DAG) where
    there is no API to ask. Returns how many configs were checked (0: not checked here)."""
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
    try:
        if host:
            checked, origin = check_task(run_id, host, compiled_spec, parameters)
        else:
            checked, origin = check_inputs(compiled_spec, parameters)
    except (ValidationError, RuntimeError) as exc:
        sys.exit(f"check config: {exc}")
    print(f"run {run_id}: all {checked} stage configs are valid ({origin})")
    return checked
